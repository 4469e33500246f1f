"""Checks before start (issue 42): a table location that cannot be written is refused with a
ConfigError naming the setting, in milliseconds, before anything starts - a path under a
file, under /proc or /sys, in an immutable folder (``chattr +i``: ``chmod 0555`` does not
stop root), an S3 endpoint where nothing listens. S3 stores that answer (credentials,
buckets) and REST catalogs are checked on SeaweedFS in tests/integration (storage/
test_s3_tables.py, tables/test_iceberg_rest.py)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import rayconnect as rc
from rayconnect.pipelines.sink import check_sink
from rayconnect.storage.check import check_local_folder
from rayconnect.storage.location import StorageError

pytestmark = [pytest.mark.timeout(30)]


def refused(sink: rc.DeltaSink | rc.IcebergSink, limit_s: float = 1.0) -> str:
    """The ConfigError's message for ``sink``; the check took less than ``limit_s``."""
    started = time.monotonic()
    with pytest.raises(rc.ConfigError) as caught:
        check_sink(sink)
    assert time.monotonic() - started < limit_s
    return str(caught.value)


@pytest.fixture
def immutable_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder nobody - root included - may create files in (``chattr +i``)."""
    folder = tmp_path / "frozen"
    folder.mkdir()
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("no chattr here (the /proc and file cases stand in)")
    done = subprocess.run([chattr, "+i", str(folder)], capture_output=True, text=True)
    if done.returncode != 0:  # not root, or a filesystem without the attribute (tmpfs)
        pytest.skip(f"chattr +i not possible here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run([chattr, "-i", str(folder)], check=True)


def free_port() -> int:
    """A local port nothing listens on (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_path_under_a_file_is_refused_naming_sink_path(tmp_path: Path) -> None:
    file = tmp_path / "a-file"
    file.write_text("not a folder")
    message = refused(rc.DeltaSink(str(file / "orders")))
    assert message.startswith(f"sink.path: {file / 'orders'} cannot be written")
    assert f"{file} is a file, not a folder" in message
    assert "it is a file, not a folder" in refused(rc.DeltaSink(str(file)))


@pytest.mark.parametrize("path", ["/proc/rayconnect/orders", "/sys/orders", "/proc"])
def test_a_path_under_proc_or_sys_is_refused(path: str) -> None:
    message = refused(rc.DeltaSink(path))
    assert message.startswith(f"sink.path: {path} cannot be written")
    assert "a virtual filesystem of the kernel" in message


def test_an_immutable_folder_is_refused_even_for_root(immutable_folder: Path) -> None:
    message = refused(rc.DeltaSink(str(immutable_folder / "orders")))
    assert f"sink.path: {immutable_folder / 'orders'} cannot be written" in message
    assert str(immutable_folder) in message
    # the table folder itself, existing and immutable
    assert "cannot be written" in refused(rc.DeltaSink(str(immutable_folder)))


def test_iceberg_settings_are_named(tmp_path: Path, immutable_folder: Path) -> None:
    """The setting the location comes from: the warehouse (the embedded catalog's sqlite is
    there too), a table_location, or a catalog's sqlite uri."""
    frozen = str(immutable_folder)
    message = refused(rc.IcebergSink("db.orders", warehouse=f"{frozen}/wh"))
    assert message.startswith(f"sink.warehouse: {frozen}/wh/db/orders cannot be written")
    message = refused(
        rc.IcebergSink("db.orders", warehouse=str(tmp_path / "wh"), table_location="/proc/t")
    )
    assert message.startswith("sink.table_location: /proc/t cannot be written")
    catalog = {"type": "sql", "uri": f"sqlite:///{frozen}/c/catalog.db", "warehouse": "/x"}
    message = refused(
        rc.IcebergSink("db.orders", catalog=catalog, table_location=str(tmp_path / "t"))
    )
    assert message.startswith(f"sink.catalog.uri: {frozen}/c cannot be written")
    assert not (tmp_path / "wh").exists()  # refused before the catalog was opened


def test_a_writable_path_passes_and_nothing_is_left_behind(tmp_path: Path) -> None:
    started = time.monotonic()
    check_sink(rc.DeltaSink(str(tmp_path / "new" / "orders")))  # made by the first commit
    check_local_folder(str(tmp_path), "sink.path")  # an existing folder
    assert time.monotonic() - started < 0.5
    assert list(tmp_path.iterdir()) == []  # no probe file, no folder made


def test_check_local_folder_raises_storage_error_naming_the_setting(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(StorageError, match=r"^sink\.table_location: .* a file, not a folder"):
        check_local_folder(str(tmp_path / "f" / "t"), "sink.table_location")


def test_s3_endpoint_where_nothing_listens_is_refused_fast() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    options = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "key",
        "AWS_SECRET_ACCESS_KEY": "secret",
    }
    message = refused(rc.DeltaSink("s3://lake/orders", storage_options=options), limit_s=2.0)
    assert f"sink.storage_options.AWS_ENDPOINT_URL: cannot reach {endpoint}" in message
    assert "refused" in message.lower() and "secret" not in message
    iceberg = rc.IcebergSink(
        "db.orders",
        catalog={"type": "sql", "uri": "sqlite:///:memory:", "warehouse": "s3://lake"},
        storage_options=options,
    )
    assert "AWS_ENDPOINT_URL: cannot reach" in refused(iceberg, limit_s=2.0)


def test_s3_endpoint_from_the_environment_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    message = refused(rc.DeltaSink("s3://lake/orders"), limit_s=2.0)
    assert f"the environment variable AWS_ENDPOINT_URL: cannot reach {endpoint}" in message


def test_cli_exit_code_of_a_refused_table_is_2(tmp_path: Path) -> None:
    from rayconnect.cli.exit_codes import EXIT_USAGE, exit_code

    (tmp_path / "f").write_text("")
    with pytest.raises(rc.ConfigError) as caught:
        check_sink(rc.DeltaSink(str(tmp_path / "f" / "t")))
    assert exit_code(caught.value) == EXIT_USAGE
    assert exit_code(rc.TableRecoveryError("recovering its table failed")) == EXIT_USAGE
