"""transformers.data.data_collator's names (lathe.data_collator)."""

from lathe.train.data.collator_base import (  # noqa: F401
    DataCollator,
    DataCollatorMixin,
    InputDataClass,
    pad_without_fast_tokenizer_warning,
    to_numpy,
)
from lathe.train.data.collators import (  # noqa: F401
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorWithFlattening,
    DataCollatorWithPadding,
    DefaultDataCollator,
    default_data_collator,
    numpy_default_data_collator,
    torch_default_data_collator,
)
from lathe.train.data.permutation import DataCollatorForPermutationLanguageModeling  # noqa: F401
from lathe.train.data.token_collators import (  # noqa: F401
    DataCollatorForMultipleChoice,
    DataCollatorForTokenClassification,
)
