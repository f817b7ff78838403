"""What the runtime can execute: the one predicate (``predicate``) shared by the planner's candidates and the
runtime's pre-flight, with its rules per layer family (attention, spatial, views, volumes, windows).
"""
