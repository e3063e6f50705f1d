"""Helpers the tests share, imported as ``helpers.<module>`` (pytest's ``pythonpath`` holds ``tests/``):

- ``runmaker``: recorded runs for the dashboard's tests (a rich run, a live run, a long run);
- ``dashpost``: a Dash callback posted the way the browser posts it (the app's test client);
- ``hostile_cases``: crafted run folders (tests/hostile) and a healthy run beside them;
- ``browser``: a headless Chromium (``make_driver``, ``need_chromium``), waiting in it, its console, a chart drawn;
- ``components``: a built Dash page read without a browser (a component by id, its text), a free port;
- ``ranks``: a two-rank run with a straggler, recorded in two threads.
"""
