// Placeholder removed by the scenario work; see core/scenario.h.
