"""Former name of :mod:`flashlab.validation`, kept while ``flashlab.walk`` still imports it."""
from flashlab.tiling import BACKWARD_BLOCK, FORWARD_BLOCK
from flashlab.validation import Problem, as_int, as_real, prepare, scores_may_overflow

__all__ = ["BACKWARD_BLOCK", "FORWARD_BLOCK", "Problem", "as_int", "as_real", "prepare",
           "scores_may_overflow"]
