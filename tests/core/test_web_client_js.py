"""Runs the web client's pure tests (tests/js/, node's test runner) inside pytest."""

import shutil
import subprocess

import pytest

from harness.servers import ROOT
from tests.timing import S


def test_chat_client_js():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed; the browser tests still cover the client")
    result = subprocess.run([node, "--test", str(ROOT / "tests/js/")], capture_output=True, text=True, timeout=60 * S)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
