"""A local run's windows scored one behind another, so the device never waits on the host between windows: window
N+1's first batch is launched before window N's last outputs are read, and window N's output part is built and
written on a writer thread (at most one waiting) while N+1 runs. Without overlap (--no-pipeline), each window
is scored and written before the next starts. Either way the windows reach the phase (report, progress) and the
sink in input order, and a window's repeats of pairs of a window still in flight are copied as they would be
had that window finished first."""

from __future__ import annotations

import dataclasses
import logging
from functools import partial

from score_batch.errors import UserError
from score_batch.job.policy import enforce_fail
from score_batch.job.runners.phase import ScoredWindow, ScoringPhase
from score_batch.job.runners.prefetch import Writer
from score_batch.job.runners.scoring import Prepared, WindowTools, planned, start, window_part

log = logging.getLogger(__name__)


class WindowRuns:
    """Score prepared windows (`score`, in input order), then `drain`; leaving it on an error waits for the
    parts being written (they count, as in a run that stopped after writing them) and drops the window in
    flight."""

    def __init__(
        self, tools: WindowTools, scorer, phase: ScoringPhase, sink, label: str, overlap: bool, dry_run: bool
    ) -> None:
        self.tools, self.scorer, self.phase, self.sink = tools, scorer, phase, sink
        self.label, self.overlap, self.dry_run = label, overlap, dry_run
        self._writer: Writer[tuple[int, ScoredWindow]] = Writer(overlap)
        self._running: tuple[Prepared, object] | None = None  # launched, its last outputs not read
        self._unsettled: dict[int, set] = {}  # window number → its pairs' keys, until it is counted

    def score(self, prepared: Prepared) -> None:
        """Plan (copying repeats), launch, and hand the window before this one to the writer."""
        keys = set(prepared.keys)
        keys.discard(None)
        if any(not keys.isdisjoint(held) for held in self._unsettled.values()):
            self.drain()  # a pair of a window in flight: copied from it, once it is written
        prepared = planned(prepared, self.tools)
        self.phase.advance(len(prepared.reused) + len(prepared.copies))  # copied pairs are done already
        running = start(prepared, self.tools, self.scorer, self.phase.advance)  # its first batch launched
        self._unsettled[prepared.number] = keys
        self._collect()  # the previous window's last outputs read (the device has this one's first batch)
        self._running = (prepared, running)
        running.launch_rest()
        if not self.overlap:
            self.drain()
        self._count(block=False)

    def drain(self) -> None:
        """Every window read, written and counted."""
        self._collect()
        self._count(block=True)

    def _collect(self) -> None:
        """The running window's results read; its part built and written by the writer."""
        if self._running is None:
            return
        prepared, running = self._running
        self._running = None
        results = running.results()
        stats = prepared.plan.stats
        prepared = dataclasses.replace(prepared, plan=None)  # the plan's encodings not kept for the writer
        self._writer.submit(partial(self._write, prepared, results, stats))

    def _write(self, prepared: Prepared, results: list, stats) -> tuple[int, ScoredWindow]:
        """(The writer's job) a window's part and ScoredWindow; its pairs remembered, the part written."""
        part, scored = window_part(prepared, self.tools, results, stats)
        self.tools.pairs.add(part)
        try:
            enforce_fail(self.tools.contract, part, self.label)  # a dry run stops where the real run would
        except UserError as error:
            raise _Unwritten(dataclasses.replace(scored, written=False), error) from None
        if not self.dry_run:
            try:
                self.sink.write(prepared.number, part, self.tools.contract, prepared.digest)
            except Exception as error:  # counted, then raised: as in a run that writes each window in turn
                raise _Unwritten(scored, error) from None
        return prepared.number, scored

    def _count(self, block: bool) -> None:
        """Add the written windows to the phase, in order; a window that stopped the run raises here."""
        for future in self._writer.finished(block):
            try:
                number, scored = future.result()
            except _Unwritten as unwritten:
                self.phase.add(unwritten.scored)
                raise unwritten.error from None
            self._unsettled.pop(number, None)
            self.phase.add(scored)

    def __enter__(self) -> WindowRuns:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self._running = None  # a window not read whole is not written (as when scoring stopped inside it)
        try:
            if error is not None:
                for future in self._writer.finished(block=True):
                    if future.exception() is None:
                        self.phase.add(future.result()[1])
        finally:
            self._writer.close()


class _Unwritten(Exception):
    """A window the writer did not write (--on-error fail's failed row, a failed write): its counts, the cause."""

    def __init__(self, scored: ScoredWindow, error: Exception) -> None:
        super().__init__(str(error))
        self.scored, self.error = scored, error
