"""Shared set-up: one private cache per test run, one tiny model in it.

HP_AGENT_CACHE is set when this file is imported, before test modules are collected,
so skip conditions evaluated at collection (e.g. "is the ALFWorld data here?") see the
same cache as the tests. Under pytest-xdist the controller makes the cache and its
workers inherit it, so the tiny model is built and the ALFWorld games unpacked once per
run; the controller removes it at the end. Set HP_AGENT_TEST_CACHE to reuse a cache
across runs.
"""

import os
import shutil
import tempfile

import pytest
import torch

torch.set_num_threads(1)

_REUSED_CACHE = os.environ.get("HP_AGENT_TEST_CACHE")
_WORKER = "PYTEST_XDIST_WORKER" in os.environ
if not _WORKER or "HP_AGENT_CACHE" not in os.environ:
    os.environ["HP_AGENT_CACHE"] = _REUSED_CACHE or tempfile.mkdtemp(prefix="hp_agent_test_cache_")
_OWN_CACHE = not _WORKER and not _REUSED_CACHE


def pytest_unconfigure(config):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["HP_AGENT_CACHE"], ignore_errors=True)


@pytest.fixture(scope="session")
def _private_cache():
    return os.environ["HP_AGENT_CACHE"]


@pytest.fixture(scope="session")
def tiny_policy(_private_cache):
    from hp_agent.policies import load_policy

    torch.manual_seed(0)
    return load_policy("tiny")
