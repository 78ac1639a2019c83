"""torch.fx helpers the passes share: reading BatchNorms in a graph, naming new submodules, hashable argument keys,
connected pieces of a node set, new nodes with their fake values (``meta``), the one rebuild that replaces
groups of nodes by one call each, and the ending every rewrite shares (``finish.relint``)."""
