"""The stages a segment goes through, named once, with each stage's task and queues.

A segment is rendered in two stages, each a task on a pool of its own: `acoustic` (text to a
mel spectrogram) then `vocoder` (mel to audio). `rest` is no third task: it is the rest of a
segment's vocoder stage after it gave way to waiting first windows (tasks/segments.py,
`_give_way`), which the admission ledger (app/stores/ledger.py) counts apart from the
segment's first vocoder message, on the vocoder stage's queues.

Members compare equal to their strings (Stage.VOCODER == "vocoder"), which is what the
broker's queue names, the ledger's Redis fields, the metrics' labels and the API hold, so
nothing on the wire changes and a value read back needs no conversion. The queue table that
is built from this one (what each pool reads, the routes) is app/broker/celery_app.py's.
Light on purpose (no Celery): the command line reads its pool names from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Stage(StrEnum):
    ACOUSTIC = "acoustic"
    VOCODER = "vocoder"
    REST = "rest"


# The stages a segment runs through, in order: the ones with a task, a pool and queues.
PIPELINE = (Stage.ACOUSTIC, Stage.VOCODER)


@dataclass(frozen=True)
class StageRoute:
    """One pipeline stage's task and queues. `queue`, the stage's own interactive queue, is
    named after the stage; `lead` takes a job's first segment, `rest` (the vocoder's only;
    "" for none) what gave way, `batch` a book's segments, `overflow` what a GPU worker
    short of memory handed to the CPU pools (app/broker/celery_app.py says why each is)."""

    stage: Stage
    task: str
    lead: str
    rest: str
    batch: str
    overflow: str

    @property
    def queue(self) -> str:
        return self.stage.value

    @property
    def interactive(self) -> tuple[str, ...]:
        """The stage's interactive queues, most urgent first."""
        return tuple(q for q in (self.lead, self.rest, self.queue) if q)


ROUTES = {
    Stage.ACOUSTIC: StageRoute(Stage.ACOUSTIC, task="voxfarm.acoustic.synthesize",
                               lead="acoustic_lead", rest="", batch="acoustic_batch",
                               overflow="acoustic_cpu"),
    Stage.VOCODER: StageRoute(Stage.VOCODER, task="voxfarm.vocoder.render",
                              lead="vocoder_lead", rest="vocoder_rest", batch="vocoder_batch",
                              overflow="vocoder_cpu"),
}
# The task that runs each stage, and back (a task's name to its stage).
STAGE_OF_TASK = {route.task: stage for stage, route in ROUTES.items()}

# The pools that are not a stage: book orchestration, and the voice canary's judge.
BOOK_POOL = "book"
QUALITY_POOL = "quality"
# Every pool, as `voxfarm worker POOL` names it: a stage's pool is named after its stage.
POOLS = (*(s.value for s in PIPELINE), BOOK_POOL, QUALITY_POOL)
