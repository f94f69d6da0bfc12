"""Start-up cost of `peregrine train`: nothing heavy on the path that is not needed.

Each check runs in a fresh interpreter, since what it asserts is which modules
a process imports.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import peregrine

pytest.importorskip("torch")
SOURCE = str(Path(peregrine.__file__).resolve().parents[1])


def run_python(code: str, tmp_path) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SOURCE, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_training_run_imports_no_compiler_no_matplotlib(tmp_path):
    out = run_python(
        "import sys\n"
        "from peregrine.cli import main\n"
        "code = main(['train', 'cartpole', '--detach', '--run-dir', 'run', '--total-steps', '2048',\n"
        "             '--train.checkpoint-interval', '1'])\n"
        "assert code == 0\n"
        "import torch, pathlib\n"
        "from peregrine.train import checkpoint\n"
        "assert checkpoint.load('run')['updates'] == 2\n"
        "assert pathlib.Path('run/learning_curve.png').stat().st_size > 0\n"
        "assert torch.are_deterministic_algorithms_enabled()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('torch._dynamo', 'torch._inductor',\n"
        "                                                    'matplotlib', 'tensorboard'))))\n",
        tmp_path)
    assert out.strip().splitlines()[-1] == "[]"


def test_fast_optimizer_step_matches_torch_and_hands_back_to_dynamo(tmp_path):
    out = run_python(
        "import sys, torch\n"
        "from peregrine.train import torch_startup\n"
        "assert torch_startup.defer_dynamo_in_optimizer(torch.optim.Adam) >= 2\n"
        "def model_and_optimizer():\n"
        "    torch.manual_seed(0)\n"
        "    model = torch.nn.Linear(4, 3)\n"
        "    return model, torch.optim.Adam(model.parameters(), lr=0.1, fused=True)\n"
        "def train(model, optimizer, step):\n"
        "    for i in range(5):\n"
        "        optimizer.zero_grad()\n"
        "        model(torch.full((2, 4), float(i))).square().sum().backward()\n"
        "        step()\n"
        "    return [p.detach().clone() for p in model.parameters()]\n"
        "fast_model, fast = model_and_optimizer()\n"
        "fast_params = train(fast_model, fast, torch_startup.step_function(fast))\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        "torch_model, reference = model_and_optimizer()\n"
        "reference_params = train(torch_model, reference, reference.step)\n"
        "assert 'torch._dynamo' in sys.modules  # torch's own step imports it\n"
        "assert all(torch.equal(a, b) for a, b in zip(fast_params, reference_params))\n"
        "assert torch.equal(fast.state_dict()['state'][0]['exp_avg'],\n"
        "                   reference.state_dict()['state'][0]['exp_avg'])\n"
        "cached = getattr(torch.optim.Optimizer.zero_grad.__wrapped__, '__dynamo_disable')\n"
        "assert cached.__module__.startswith('torch')  # torch's real disabled function now\n"
        "print('ok')\n",
        tmp_path)
    assert out.strip() == "ok"
