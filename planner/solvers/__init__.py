"""The exact solvers of a cost table: chain shortest path, variable elimination, the 0/1 ILP and its back ends,
brute force (the test oracle), safe pruning and the runner-up explanations.
"""
