"""transformers.data.data_collator's names (lathe.data_collator)."""

from lathe.train.collators import (  # noqa: F401
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorWithFlattening,
    DataCollatorWithPadding,
    DefaultDataCollator,
    default_data_collator,
)
