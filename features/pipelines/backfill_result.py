"""What a backfill of one group did: its counts, what it set aside and where its time went, and the line that says
it (features.pipelines.backfill makes it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from features.engine.files import SetAsideFile
from features.engine.schema import FILE_REASONS

if TYPE_CHECKING:
    from features.quality import ValidationReport


@dataclass(frozen=True)
class BackfillResult:
    group: str
    start: datetime
    end: datetime
    rows_in: int
    rows_out: int
    online_rows: int
    seconds: float
    # Bad source records set aside (per reason) and where; the validation of the change points; and, when they
    # failed it under the "quarantine" policy, where the batch went instead of the stores.
    quarantined: Mapping[str, int] = field(default_factory=dict)
    quarantine_path: str | None = None
    validation: ValidationReport | None = None
    batch_quarantined: str | None = None
    # Where the time went, in seconds: compute (planning the Spark pass: its rows are computed by the first job
    # that reads them, validation's screen, else the commit), validation, online (while the offline commit runs),
    # offline (the rest of that commit), tracking (waiting for the MLflow run, made in the background, before
    # writing), and from `backfill`: spark_start (waiting for the session).
    timings: dict[str, float] = field(default_factory=dict)
    # The source files set aside whole (unreadable, or not conforming to the source's schema): a record each
    # among `quarantined`, and the events they hold.
    files_set_aside: tuple[SetAsideFile, ...] = ()
    # The features computed, when only some were (the others' values were kept from the table); () when all were.
    only: tuple[str, ...] = ()

    @property
    def records_quarantined(self) -> int:
        return sum(self.quarantined.values())

    @property
    def events_set_aside(self) -> int:
        """The events of the files set aside whole."""
        return sum(f.events for f in self.files_set_aside)

    def summary(self) -> str:
        span = f"[{self.start.isoformat()}, {self.end.isoformat()})"
        if self.batch_quarantined is not None:
            failed = ", ".join(repr(n) for n in self.validation.failed_names()) if self.validation else ""
            text = (
                f"{self.group}: {self.rows_in:,} events in; the change points for {span} failed validation "
                f"({failed}) and were quarantined in {self.batch_quarantined}, nothing written, {self.seconds:.1f}s"
            )
        else:
            text = (
                f"{self.group}: {self.rows_in:,} events in, {self.rows_out:,} change points out for {span}, "
                f"{self.online_rows:,} keys online, {self.seconds:.1f}s"
            )
            if self.only:
                text += f" (computed {', '.join(self.only)}; the others kept from the table)"

        return text + self._set_aside_text()

    def _set_aside_text(self) -> str:
        """What was set aside: the files (how many, of what kind, their names and events), then the bad
        records (how many, per reason), and where they went."""
        parts = []
        if self.files_set_aside:
            kinds: dict[str, list[str]] = {}
            for f in self.files_set_aside:
                kinds.setdefault(f.kind, []).append(Path(f.file).name)
            listed = "; ".join(f"{len(names):,} {kind}: {_names(names)}" for kind, names in sorted(kinds.items()))
            parts.append(
                f"{_plural(len(self.files_set_aside), 'file')} set aside whole with "
                f"{_plural(self.events_set_aside, 'event')} ({listed})"
            )
        records = {r: n for r, n in self.quarantined.items() if r.split(":", 1)[0] not in FILE_REASONS}
        if records:
            reasons = ", ".join(f"{n:,} {reason}" for reason, n in records.items())
            parts.append(f"{sum(records.values()):,} bad source records quarantined ({reasons})")
        if not parts:
            return ""
        return "; " + ", ".join(parts) + (f" in {self.quarantine_path}" if self.quarantine_path else "")


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _names(names: list[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"
