"""RunConfig: every setting of one score-batch run, resolved once from the flags."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from engine import EngineConfig
from io_formats.schema import ColumnOverrides

ON_ERROR_MODES = ("fail", "record", "skip")
DEFAULT_WINDOW_ROWS = 2048
DEMO_MODEL_DIR = Path(__file__).resolve().parent.parent / "sample_data" / "demo_model"


@dataclass(frozen=True)
class RunConfig:
    """One run: input, output, model, columns, engine settings and batch-job behaviour."""

    input: str
    output: str
    model_dir: Path
    columns: ColumnOverrides
    engine: EngineConfig
    window_rows: int = DEFAULT_WINDOW_ROWS
    on_error: str = "fail"
    errors_file: str | None = None
    resume: bool = False
    overwrite: bool = False
    report: str | None = None
    dry_run: bool = False
    quiet: bool = False

    def fingerprint(self, model_identity: list, input_identity: list) -> str:
        """A hash of everything that decides the output rows, for refusing a mismatched --resume."""
        settings = dataclasses.asdict(self)
        for name in ("resume", "overwrite", "report", "dry_run", "quiet", "errors_file", "output"):
            settings.pop(name)
        payload = json.dumps([settings, model_identity, input_identity], sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()


def model_identity(model_dir: Path) -> list:
    """The model's config and the names, sizes and times of its weight files."""
    entries = [["config.json", hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()]]
    for path in sorted(model_dir.iterdir()):
        if path.suffix in (".safetensors", ".bin", ".json") and path.is_file():
            entries.append([path.name, path.stat().st_size, path.stat().st_mtime_ns])
    return entries
