"""The ahead-of-time build of the decision compiles the current sources, never a JIT cache of
other ones: numba checks a cached function against its own file only, so a caller's cached code
would carry an edited callee's old code into the build."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelgen.policies.accelgen import build as builds


class _RecordingCC:
    """numba.pycc.CC's surface that ``build`` uses; ``compile`` notes whether the stale cache file
    still existed and writes an empty module."""

    stale: Path
    seen: list[bool]

    def __init__(self, name: str) -> None:
        self.name, self.output_dir, self.use_nrt = name, "", True

    def export(self, name: str, signature: object) -> object:
        return lambda fn: fn

    def compile(self) -> None:
        self.seen.append(self.stale.exists())
        (Path(self.output_dir) / f"{self.name}.so").write_bytes(b"")


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # (importing numba.pycc)
def test_the_build_drops_a_jit_cache_of_other_sources(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    stale = cache / "batch.next_group-64.py311.1.nbc"  # compiled against an older callee
    stale.write_bytes(b"old code")
    (cache / "jit_sources").write_text("the digest of other sources")
    monkeypatch.setattr(builds, "_CACHE", cache)
    recording = type("CC", (_RecordingCC,), {"stale": stale, "seen": []})
    monkeypatch.setattr("numba.pycc.CC", recording)
    out = builds.build(tmp_path / "decide_test.so")
    assert recording.seen == [False]  # gone before numba compiled
    assert (cache / "jit_sources").read_text() == builds.source_digest()
    assert out.exists()
