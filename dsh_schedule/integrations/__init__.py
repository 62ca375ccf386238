"""Schedule for agent frameworks, on the asyncio host API (docs/integrations/README.md).

- ``dsh_schedule.integrations.session``: records the host-contract events of a turn in
  the session log (docs/architecture.md#host-event-vocabulary); needs no framework.
- ``dsh_schedule.integrations.langgraph`` (extra ``[langgraph]``): the tools as LangChain
  structured tools, a recorder of graph runs and a followup loop.
- ``dsh_schedule.integrations.pydantic_ai`` (extra ``[pydantic-ai]``): the tools as
  Pydantic AI tools, a recorder of agent runs and a followup loop.

Nothing outside this package imports an agent framework (an import-linter contract).
"""
