"""What the text recipes share: the BERT-style base (`bert`), the sentencepiece tokenizer (`tokenizer`) and the
PaddleNLP ones it reads (`foreign_tokenizer`), gettext catalogs into cleaned, deduplicated, hash-split sentence
pairs (`catalogs`), and pretrained bases on disk (`base`). ABNet, ELECTRA, the federated and LLM recipes import
these modules, never each other's."""
