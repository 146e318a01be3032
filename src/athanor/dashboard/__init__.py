"""`athanor dashboard`: a read-only web view of an experiment store, live while a compile or a server writes it.

- `views`: what each page shows, read from the store into plain dataclasses (no HTML);
- `charts`: the figures, as inline SVG for the pages and as PNG files (`--png`, matplotlib);
- `app`: the FastAPI app: GET routes only, the store opened read-only, every text escaped by the templates, no asset
  from the network, a strict content security policy; pages refresh their `<main>` from the same URL.
"""
