"""memlab: predict, run, measure and compare how deep-learning training and inference use memory and compute.

The math modules (:mod:`memlab.models`, :mod:`memlab.setup`, :mod:`memlab.estimate`, :mod:`memlab.flops`)
import no torch; measurement lives in :mod:`memlab.measure`, :mod:`memlab.gpt` and :mod:`memlab.runner`.
"""

from memlab.errors import ConfigError, MemlabError, SetupError, UnknownNameError
from memlab.models import TransformerConfig, preset
from memlab.setup import Setup

__all__ = ["ConfigError", "MemlabError", "Setup", "SetupError", "TransformerConfig", "UnknownNameError", "preset"]
__version__ = "0.1.0"
