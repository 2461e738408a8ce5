"""``pipeoffload playground``: a local web app drawing a schedule and its memory as its inputs change.

Standard library only (``http.server`` on 127.0.0.1) and a small hand-written JS/SVG front end in
``static/``; nothing is fetched from the network.
"""
