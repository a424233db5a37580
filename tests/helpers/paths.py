"""Where the repository keeps what the tests read: the fixtures under tests/data, the notebooks, the README.

Every test and helper finds its files through these names, so a test file can move between the folders of
tests/ without its paths changing.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
DATA = ROOT / "tests" / "data"
HF_DATA = DATA / "hf"  # transformers' tiny checkpoints and their outputs (tests/tools/make_hf_fixtures.py)
GGUF_GOLDENS = DATA / "gguf"  # the real GGUF models' greedy goldens (tests/tools/make_gguf_goldens.py)
# llama.cpp's vocabulary-only GGUF files and their tokenizations, when a folder shared/tokenizer-suite sits
# beside the clone (README.md); the tests that read it skip without it
TOKENIZER_SUITE = ROOT.parent / "shared" / "tokenizer-suite"
