"""Configuration: defaults, YAML file, environment and flags, and errors that name the option."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from otel_guard_processor.config import (
    MAX_CONFIG_BYTES,
    OPTIONS,
    ConfigError,
    ProcessorConfig,
    load_config,
    parse_address,
)


def test_defaults_are_the_contract() -> None:
    config = load_config({}, environ={})
    assert config.listen == "127.0.0.1:4317"
    assert config.http_listen is None
    assert config.forward is None
    assert config.prometheus == "127.0.0.1:4390"


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    file = tmp_path / "processor.yaml"
    file.write_text("max_traces: 100\ntrace_ttl: 30\nforward: 127.0.0.1:4318\nhttp_listen: 127.0.0.1:4319\n")
    environ = {"OTEL_GUARD_PROCESSOR_TRACE_TTL": "45", "OTEL_GUARD_PROCESSOR_FORWARD": "off"}
    config = load_config({"max_traces": "200"}, environ=environ, config_file=file)
    assert config.max_traces == 200  # flag over file
    assert config.trace_ttl == 45.0  # environment over file
    assert config.forward is None  # "off" in the environment turns the file's value off
    assert config.http_listen == "127.0.0.1:4319"  # the file's value stands


def test_yaml_off_is_off(tmp_path: Path) -> None:
    file = tmp_path / "processor.yaml"
    file.write_text("prometheus: off\n")  # YAML reads a bare off as false
    assert load_config({}, environ={}, config_file=file).prometheus is None


@pytest.mark.parametrize(
    ("flags", "environ", "option", "source"),
    [
        ({"listen": "localhost"}, {}, "listen", "flag --listen"),
        ({}, {"OTEL_GUARD_PROCESSOR_FORWARD": "host:99999"}, "forward", "OTEL_GUARD_PROCESSOR_FORWARD"),
        ({"max_traces": "1"}, {}, "max_traces", "flag --max-traces"),
        ({"max_spans": "0"}, {}, "max_spans", "flag --max-spans"),
        ({"trace_ttl": "-5"}, {}, "trace_ttl", "flag --trace-ttl"),
        ({"forward_timeout": "nan"}, {}, "forward_timeout", "flag --forward-timeout"),
        ({"max_inflight": "many"}, {}, "max_inflight", "flag --max-inflight"),
        ({"log_level": "loud"}, {}, "log_level", "flag --log-level"),
    ],
)
def test_bad_values_name_the_option_and_where_it_came_from(
    flags: dict[str, str], environ: dict[str, str], option: str, source: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(flags, environ=environ)
    assert caught.value.option == option
    assert str(caught.value).startswith(option)
    assert source in str(caught.value)


def test_yaml_errors_name_the_file_and_the_key(tmp_path: Path) -> None:
    file = tmp_path / "processor.yaml"
    file.write_text("max_traces: 10\nmax_trace: 10\n")
    with pytest.raises(ConfigError, match=r"unknown option\(s\) max_trace"):
        load_config({}, environ={}, config_file=file)
    file.write_text('listen: "127.0.0.1:4317\n')
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config({}, environ={}, config_file=file)
    file.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config({}, environ={}, config_file=file)
    file.write_text("max_traces: lots\n")
    with pytest.raises(ConfigError, match=r"max_traces \(from config file .*processor.yaml\)"):
        load_config({}, environ={}, config_file=file)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config({}, environ={}, config_file=tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("max_traces: &n 100\nmax_spans: *n\n", r"line 1, column 13: anchors \(&n\) are not accepted"),
        ("max_traces: *n\n", r"line 1, column 13: aliases \(\*n\) are not accepted"),
        ("max_traces: [100]\n", r"line 1, column 13: max_traces must be one value, not a list"),
        ("max_traces: {a: 1}\n", r"max_traces must be one value, not a list or a mapping"),
        ("[a, b]: 1\n", r"line 1, column 1: an option name must be a word"),
        ("max_traces: 100\nmax_traces: 200\n", r"line 2, column 1: option max_traces is given twice"),
        ("max_traces: 100\n---\nmax_spans: 10\n", r"line 2, column 1: more than one YAML document"),
        (
            "max_traces: " + "9" * 5000 + "\n",
            r"the value of max_traces is 5000 characters long; at most 4096",
        ),
        ("max_traces: 2001-13-45\n", r"cannot read the value of max_traces: month must be in 1\.\.12"),
        ("max_traces: !!python/object:os.system x\n", r"could not determine a constructor"),
        ("listen: \x00\n", r"not valid YAML: character 8: .*characters are not allowed"),
    ],
)
def test_a_config_file_is_a_flat_mapping_of_single_values(tmp_path: Path, text: str, error: str) -> None:
    file = tmp_path / "processor.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config({}, environ={}, config_file=file)
    message = str(caught.value)
    assert message.startswith(f"config: {file}")
    assert "\n" not in message
    assert re.search(error, message), message


def test_a_config_file_is_read_to_a_bound(tmp_path: Path) -> None:
    file = tmp_path / "processor.yaml"
    file.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError, match=rf"larger than {MAX_CONFIG_BYTES} bytes"):
        load_config({}, environ={}, config_file=file)
    file.write_bytes(b"listen: \xff\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 8"):
        load_config({}, environ={}, config_file=file)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "~\n", "---\n"])
def test_an_empty_config_file_sets_nothing(tmp_path: Path, text: str) -> None:
    file = tmp_path / "processor.yaml"
    file.write_text(text)
    assert load_config({}, environ={}, config_file=file) == ProcessorConfig()


def test_yaml_values_are_read_as_yaml_reads_them(tmp_path: Path) -> None:
    file = tmp_path / "processor.yaml"
    file.write_text("max_traces: 1_000\nforward: ~\nhttp_listen: '127.0.0.1:4318'\nretry_after: 2.5\n")
    config = load_config({}, environ={}, config_file=file)
    assert (config.max_traces, config.forward, config.http_listen, config.retry_after) == (
        1000,
        None,
        "127.0.0.1:4318",
        2.5,
    )


def test_every_setting_has_a_flag_and_a_variable() -> None:
    names = {option.name for option in OPTIONS}
    assert names == set(ProcessorConfig.__dataclass_fields__)
    assert {option.env for option in OPTIONS} == {f"OTEL_GUARD_PROCESSOR_{name.upper()}" for name in names}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:4317", ("127.0.0.1", 4317)),
        ("[::1]:0", ("::1", 0)),
        ("collector:4317", ("collector", 4317)),
    ],
)
def test_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["4317", ":4317", "host:", "host:port", "host:70000"])
def test_bad_addresses(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_address(text)
