"""`mncloud ui`: a local, read-only web view of runs over what `status` and `runs` read.

    views.py   the facts a page shows (operate/, records/, the checkpoint bucket)
    svg.py     the timeline and the goodput breakdown, drawn on the server as SVG
    curves.py  training curves (metrics over steps, step time per node) as SVG
    app.py     the FastAPI app: routes, templates (templates/ui/), token, read-only
    serve.py   host and port checks, the token, uvicorn

FastAPI and uvicorn come with the `[ui]` extra; nothing here is imported by the other
commands.
"""
