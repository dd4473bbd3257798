"""transformers.optimization's import path."""

from lathe.train.optim.adafactor import Adafactor, AdafactorSchedule, get_adafactor_schedule  # noqa: F401
from lathe.train.optim.greedy import GreedyLR, StreamingAverage, get_greedy_schedule  # noqa: F401
from lathe.train.optim.named_schedules import *  # noqa: F401,F403
from lathe.train.optim.optimizers import get_scheduler  # noqa: F401
