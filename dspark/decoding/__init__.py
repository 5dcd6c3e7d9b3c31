"""Propose -> verify -> accept: the drafters, the verifiers and the engine."""

from dspark.decoding.draft_length import StepCost
from dspark.decoding.drafters import Drafter, DSparkDrafter, Eagle3Drafter, LookupFirstDrafter, NgramDrafter
from dspark.decoding.engine import GenerationResult, SpeculativeEngine
from dspark.decoding.proposal import Proposal
from dspark.decoding.sampling import SamplingParams
from dspark.decoding.step_timing import measure_step_cost
from dspark.decoding.verify import Verdict, verify_greedy, verify_greedy_rows, verify_sampling, verify_sampling_rows

__all__ = [
    "DSparkDrafter",
    "Drafter",
    "Eagle3Drafter",
    "GenerationResult",
    "LookupFirstDrafter",
    "NgramDrafter",
    "Proposal",
    "SamplingParams",
    "SpeculativeEngine",
    "StepCost",
    "Verdict",
    "measure_step_cost",
    "verify_greedy",
    "verify_greedy_rows",
    "verify_sampling",
    "verify_sampling_rows",
]
