"""advise: from a stored comparison to a decision.

requirements and presets (what the user needs), constraints judged with their intervals, the Pareto
front, the recommendation and the measured selection matrix, and comparing runs over time. Every
function here is pure over a `measure.analysis.Comparison`; only `recommend_stored` reads a store.
"""
