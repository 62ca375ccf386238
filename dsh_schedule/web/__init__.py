"""The web console (``dsh-schedule web``, docs/web.md): watch and drive reminders in a
browser. Needs the ``web`` extra (FastAPI, uvicorn, Jinja); nothing here is imported
unless that command runs."""
