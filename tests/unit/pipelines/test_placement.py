"""rc.Placement: the setting that places a sink pipeline's actors and Spark executors on a
Ray cluster; its Ray options, its checks, and how a pipeline file spells it."""

from __future__ import annotations

import re

import pytest

import rayconnect as rc
from rayconnect.cli.pipeline_file import PipelineFileError, loads_pipeline
from rayconnect.config import placement as placement_module
from rayconnect.config.placement import matches
from rayconnect.errors import ConfigError

pytestmark = [pytest.mark.timeout(30)]

FILE = """\
kind: sink
name: orders
source:
  metadata:
    streams:
      - stream_id: orders
        clusters:
          local: {bootstrap_servers: "127.0.0.1:9092", topics: [orders]}
sink: {path: /data/orders}
"""


def test_spread_is_the_default_for_actors_and_executors():
    placement = rc.Placement()
    assert placement.actor_options("participant") == {"scheduling_strategy": "SPREAD"}
    assert placement.spark_group_strategy == "SPREAD"
    assert loads_pipeline(FILE).placement == placement


def test_pack_prefers_the_starting_processs_node_and_packs_the_executors(monkeypatch):
    monkeypatch.setattr(placement_module, "_this_node", lambda: "ab12")
    placement = rc.Placement("pack")
    assert placement.actor_options("reader") == {
        "label_selector": {"ray.io/node-id": "ab12"},
        "fallback_strategy": [{"label_selector": {}}],
    }
    assert placement.spark_group_strategy == "PACK"


def test_a_preferred_role_gets_a_label_selector_that_falls_back_to_any_node():
    placement = rc.Placement(prefer={"reader": {"pool": "ingest"}})
    assert placement.actor_options("reader") == {
        "label_selector": {"pool": "ingest"},
        "fallback_strategy": [{"label_selector": {}}],
    }
    assert placement.actor_options("writer") == {"scheduling_strategy": "SPREAD"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "scatter"}, "placement.strategy 'scatter'"),
        ({"prefer": {"spark": {"pool": "a"}}}, "unknown role 'spark'"),
        ({"prefer": {"reader": {}}}, "placement.prefer['reader']: give node labels"),
        ({"prefer": {"reader": {"pool": "a b"}}}, "Invalid label selector value `a b`"),
    ],
)
def test_bad_settings_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        rc.Placement(**kwargs)


def test_a_pipeline_file_spells_placement_like_the_python_api():
    config = loads_pipeline(
        FILE + "placement: {strategy: pack, prefer: {participant: {pool: ingest}}}\n"
    )
    assert config.placement == rc.Placement("pack", {"participant": {"pool": "ingest"}})
    with pytest.raises(PipelineFileError, match=r"\$.placement.*unknown role 'spark'"):
        loads_pipeline(FILE + "placement: {prefer: {spark: {pool: a}}}\n")


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({"pool": "ingest"}, {"pool": "ingest"}, True),
        ({"pool": "ingest"}, {"pool": "spark"}, False),
        ({"pool": "ingest"}, {}, False),
        ({"pool": "!ingest"}, {}, True),
        ({"pool": "!ingest"}, {"pool": "ingest"}, False),
        ({"pool": "in(a, b)"}, {"pool": "b"}, True),
        ({"pool": "!in(a,b)"}, {"pool": "b"}, False),
        ({"pool": "a", "zone": "z1"}, {"pool": "a", "zone": "z2"}, False),
    ],
)
def test_selectors_match_node_labels_like_ray(selector, labels, expected):
    assert matches(selector, labels) is expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"executors": 0}, "spark.executors must be >= 1"),
        ({"executor_wait_s": 0}, "spark.executor_wait_s must be > 0"),
        ({"executor_lost_s": -1}, "spark.executor_lost_s must be > 0"),
    ],
)
def test_bad_spark_settings_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        rc.SparkSettings(**kwargs)
    assert loads_pipeline(FILE + "spark: {executor_wait_s: 30}\n").spark.executor_wait_s == 30
