"""The machine facts of a profile artifact: the commit of a checkout (clean, dirty, none),
and what is recorded where the OS does not say (no affinity, load average, page counts
or /proc/cpuinfo, as on macOS or Windows)."""
from __future__ import annotations

import builtins
import os
import platform
import subprocess

import pytest

from peregrine.profile import machine


def git(directory, *args):
    return subprocess.run(["git", "-C", str(directory), "-c", "user.name=t", "-c",
                           "user.email=t@example.invalid", *args], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_commit_of_a_clean_and_a_dirty_checkout_and_outside_one(tmp_path):
    outside = tmp_path / "plain"
    outside.mkdir()
    assert machine.commit_info(outside) == {"hash": None, "dirty": None}
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "first")
    head = git(repo, "rev-parse", "HEAD")
    assert machine.commit_info(repo) == {"hash": head, "dirty": False}
    (repo / "new.txt").write_text("untracked files do not count\n")
    assert machine.commit_info(repo)["dirty"] is False
    (repo / "a.txt").write_text("two\n")
    assert machine.commit_info(repo) == {"hash": head, "dirty": True}


def test_a_distribution_that_is_not_installed_has_no_version():
    assert machine._version("peregrine-no-such-distribution") is None
    assert machine._version("numpy") == __import__("numpy").__version__


def test_facts_where_the_os_does_not_say(monkeypatch):
    for name in ("sched_getaffinity", "getloadavg", "sysconf"):
        monkeypatch.delattr(os, name, raising=False)
    real_open = builtins.open

    def no_cpuinfo(path, *args, **kwargs):
        if path == "/proc/cpuinfo":
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", no_cpuinfo)
    facts = machine.machine_facts()
    assert facts["usable_cores"] == os.cpu_count()
    assert facts["load_average_1_5_15"] is None and facts["memory_gib"] is None
    assert facts["cpu_model"] == (platform.processor() or platform.machine())


def test_facts_on_linux_are_measured():
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("reads /proc/cpuinfo, which only Linux has")
    facts = machine.machine_facts()
    assert 1 <= facts["usable_cores"] <= facts["logical_cores"]
    assert len(facts["load_average_1_5_15"]) == 3 and facts["memory_gib"] > 0
    assert facts["cpu_model"]
