"""device.widen_cuda_connections: gputransforms asks CUDA for 32 hardware work queues, so that DALI's
streams share fewer of them with the training loop's (its effect is measured by benchmarks/train.py,
docs/performance-notes.md, "Training end to end")."""
import os
import subprocess
import sys

from conftest import ROOT
from gputransforms import device

VAR = "CUDA_DEVICE_MAX_CONNECTIONS"


def _python(code, env_var=None):
    env = {k: v for k, v in os.environ.items() if k != VAR}  # this process's import already set it
    if env_var is not None:
        env[VAR] = env_var
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_import_sets_connections_unless_the_user_did():
    show = "import os, gputransforms; print(os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS'), '|', " \
           "gputransforms.device.cuda_connections_note())"
    assert _python(show) == f"32 | {VAR}=32 (set by gputransforms)"
    assert _python(show, env_var="1") == f"1 | {VAR}=1 (set before gputransforms was imported)"


def test_too_late_is_said_not_done(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.setattr(device, "_connections_note", device._connections_note)  # restored as the import left it
    monkeypatch.setattr(device.torch.cuda, "is_initialized", lambda: True)
    device.widen_cuda_connections()
    assert VAR not in os.environ
    assert "CUDA started before gputransforms was imported" in device.cuda_connections_note()
