"""torch.fx helpers the passes share: reading BatchNorms in a graph, naming new submodules, hashable argument keys."""
