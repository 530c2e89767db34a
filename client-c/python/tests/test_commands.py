"""The package's console commands and its self-test (the wheel runs both;
scripts/wheel-check.sh checks them from a wheel in a fresh venv)."""

import subprocess
import sys

import pytest

from granary import _commands, selftest


def test_the_commands_find_built_binaries_and_name_where_they_looked():
    path = _commands.find("granaryd")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("granaryd ") and "(commit " in out
    with pytest.raises(FileNotFoundError) as e:
        _commands.find("granaryd-that-does-not-exist")
    assert str(_commands.bundled_dir()) in str(e.value)


def test_the_console_entry_point_runs_the_binary_with_its_arguments_and_exit_code():
    code = "import sys; sys.argv[0] = 'granary'; from granary._commands import granary; granary()"
    ok = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("granary "), ok
    bad = subprocess.run([sys.executable, "-c", code, "no-such-command"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no-such-command" in bad.stderr, bad


def test_selftest_passes_and_counts_every_sample():
    figures = selftest.run(files=120, quiet=True)
    assert figures["samples"] == 120
    assert figures["granaryd"].startswith("granaryd ")
