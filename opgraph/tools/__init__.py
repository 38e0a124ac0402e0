"""The top layer: the `opgraph` command (`cli`), pictures of plans (`draw`) and sample graphs
(`samples`). May import anything; nothing in opgraph imports it."""
