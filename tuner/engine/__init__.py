"""The engine: a federated simulation's rounds (simulation.py) over a method's pure tensor functions, the
executors that run a round's clients one by one or as one batched program (executors.py, executor_kinds.py), the
steps and phases a client trains through, the compiled programs, and the random draws a run makes."""
