"""Ensembles: models whose ``ensemble_scheduling`` runs other models as steps.

``scheduler.py`` runs an ensemble version's requests (a dataflow of step requests, each
through its step model's own batcher); ``graph.py`` checks an ensemble against its step
models' configs. The rules of an ensemble's own config are ``nereid.config.ensemble``'s.
"""

from nereid.ensembles.graph import ensemble_problem
from nereid.ensembles.scheduler import EnsembleScheduler, EnsembleTicket, StepModel, StepModels

__all__ = ["EnsembleScheduler", "EnsembleTicket", "StepModel", "StepModels", "ensemble_problem"]
