"""specvoice.llm: causal LMs, the speculative decoder, sampling, KV caches and benchmarks. Never imports voice."""
