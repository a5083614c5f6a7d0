"""The LLM recipe: a library causal LM (PaddleFormers Llama) from a local checkpoint, fine-tuned on gettext
messages across two clusters as a pipeline and with DiLoCo (`run_local.sh`, `prepare`, `summary`)."""
