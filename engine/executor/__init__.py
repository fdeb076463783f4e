"""How the model runs: in this process now (processes per rank and Ray come with parallelism)."""
