"""Ensembles: models whose ``ensemble_scheduling`` runs other models as steps.

``scheduler.py`` is an ensemble version's way in (requests, statistics, why it cannot
serve); ``dataflow.py`` runs one request as step requests through the step models' own
batchers; ``graph.py`` checks an ensemble against its step models' configs. The rules of
an ensemble's own config are ``nereid.config.ensemble``'s.
"""

from nereid.ensembles.dataflow import StepModel, StepModels
from nereid.ensembles.graph import decoupled_problem, ensemble_problem
from nereid.ensembles.scheduler import EnsembleScheduler, EnsembleTicket

__all__ = ["EnsembleScheduler", "EnsembleTicket", "StepModel", "StepModels", "decoupled_problem", "ensemble_problem"]
