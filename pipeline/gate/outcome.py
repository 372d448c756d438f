"""What every recipe returns: the artifacts by role, their measurements, and the one verdict.

Encoders and decoders alike: a recipe builds candidates, the gate judges them
(``pipeline.gate.judge``), and this record goes to the one publish flow
(``pipeline.report.publish``), which writes the report and the manifest and pushes the candidate.
What the measurements are differs by kind of model and is named by field: an encoder's
evaluations are evaluate artifacts and its timing a benchmark; a decoder's evaluations are its
text scores (score_text) and its timing the decode speed (decode_speed). A module of its own so
that a sub-recipe can build one without importing the recipe that calls it.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.gate.verdict import Verdict
from pipeline.measure.results import Role


@dataclass(frozen=True)
class PruningArtifacts:
    """A ``prune=channels`` run's own artifacts, beside the models every run has."""
    load: object             # the network before pruning
    prune: object            # the pruned, recovered network (what export starts from)
    unpruned_export: object  # the unpruned network's export: the ONNX size it is compared with


@dataclass
class Outcome:
    run: object         # the run's facts: models.run.Run (encoders) or models.decoder.Decoder
    models: dict        # Role -> Artifact: export, fp32, fp16, candidate (and auto's others)
    evals: dict         # Role -> its evaluation: evaluate (encoders), score_text (decoders)
    bench: object       # the timing: benchmark (encoders), decode_speed (decoders)
    verdict: Verdict
    source: object      # the network export starts from: load, or prune when pruning
    load: object = None  # the loadtest artifact (bench.mode=load or soak)
    quant: object = None  # QuantInfo (encoders) or recipes.decoder_record.WeightOnlyInfo
    runtimes: object = None  # runtimes.record.RuntimePlan: each artifact on each target, the pick
    pruning: PruningArtifacts | None = None  # prune=channels
    auto: object = None  # quant=auto: every candidate, the winner and why (recipes.auto_result)
    # the benchmark label the shipped candidate was timed under, per batch size (str): the
    # choice of runtime=auto and quant=auto; None: the benchmark's own candidate everywhere
    seat: dict | None = None

    def label_at(self, batch) -> str:
        """The label of the shipped candidate's timings at ``batch`` in ``bench``."""
        return (self.seat or {}).get(str(batch), Role.candidate.value)

    def timings(self):
        """The benchmark as the gate read it: from the shipped candidate's seat, typed."""
        from pipeline.measure.seat import seen_from

        return seen_from(self.bench, self.seat or Role.candidate.value)
