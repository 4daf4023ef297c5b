"""Real LangGraph graphs run as Runsite agents (`RUNS_GRAPHS`, docs/graphs.md).

loader: langgraph.json-style registration; checkpointer: a BaseCheckpointSaver over Runsite's
tables; executor: runs a graph in the worker under the run's lease; interrupts: interrupt ↔
waiting tool call; streams: graph stream chunks ↔ run events ↔ SSE frames; api: the
LangGraph surface (state, history, update_state, run options) for graph threads.
"""
