"""Speed comparisons on a shared machine: contenders measured in alternating rounds.

Each round measures every contender once, the order reversed from one round to the next
(A B C, C B A, A B C, ...), so that load from other processes falls on every contender
alike and none is always first; a figure is then the median over the rounds, which a
round disturbed by that load moves little. The benchmarks and the trainer's precision
probe (precision_speed) all time their contenders this way. Imports nothing heavy.
"""

import dataclasses
import statistics


def _itself(measurement):
    return measurement


@dataclasses.dataclass
class Contender:
    """One contender's measurements, one a round, in the order of the rounds.

    Its median and spread are of figure(measurement) for a figure function given, else of
    the measurements themselves (numbers).
    """

    name: object
    measurements: list = dataclasses.field(default_factory=list)

    def figures(self, figure=_itself):
        return [figure(measurement) for measurement in self.measurements]

    def median(self, figure=_itself):
        """The median of the figure over the rounds."""
        return statistics.median(self.figures(figure))

    def spread(self, figure=_itself):
        """The largest figure of the rounds minus the smallest."""
        figures = self.figures(figure)
        return max(figures) - min(figures)


def round_order(names, round_index):
    """The order of round `round_index` (from 0): `names` as given, reversed in odd rounds."""
    return list(names) if round_index % 2 == 0 else list(names)[::-1]


def measure(contenders, num_rounds, report=None, report_round=None):
    """Measure each contender once a round, for num_rounds rounds in alternating order.

    Args:
      contenders: dict name -> function() returning one measurement; the first round
        takes them in this order, the second in reverse, and so on.
      num_rounds: how many measurements each contender gets.
      report: optional function(round_index, name, measurement), called after each.
      report_round: optional function(round_index, {name: measurement} in contenders'
        order), called after each round.

    Returns:
      dict name -> Contender, in contenders' order.
    """
    results = {name: Contender(name) for name in contenders}
    for round_index in range(num_rounds):
        for name in round_order(contenders, round_index):
            measurement = contenders[name]()
            results[name].measurements.append(measurement)
            if report:
                report(round_index, name, measurement)
        if report_round:
            report_round(round_index, {name: result.measurements[-1]
                                       for name, result in results.items()})
    return results
