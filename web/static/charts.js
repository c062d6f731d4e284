// Dashboard charts, drawn with uPlot from the HTML table under each chart, so the numbers a chart shows
// are always the ones in its table (and readable without JavaScript).
//
//   <figure data-chart="stacked-bars|lines">
//     <div class="chart-canvas"></div>
//     <table> <thead><tr><th>Day</th><th data-series>Input</th>…</tr></thead>
//             <tbody><tr><th>2026-03-01</th><td data-value="123">123</td>…</tr></tbody> </table>
//   </figure>
//
// Each <tbody> row is one point; each header cell marked data-series is one series (a cell's
// data-value, or an empty one for "no value"). After drawing, the figure gets data-points (the point
// count) and keeps the uPlot instance as figure.uplot.
(function () {
  "use strict";

  // One palette, each colour at least 4.5:1 against the white page (WCAG 1.4.11 asks 3:1 for graphics);
  // stacked bars are outlined in white, so neighbours of similar lightness stay apart
  // (tests/web/test_chart_palette.py checks both).
  var COLORS = ["#1f5fa8", "#b35806", "#c62a47", "#11706b", "#3b7a28", "#8a6d00", "#7d3c98", "#6b4c35"];
  var SEPARATOR = "#ffffff";

  function readTable(table) {
    var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
    var columns = [];
    heads.forEach(function (cell, index) {
      if (cell.hasAttribute("data-series")) columns.push({ index: index, label: cell.textContent.trim() });
    });
    var labels = [];
    var values = columns.map(function () { return []; });
    Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
      labels.push(row.cells[0].textContent.trim());
      columns.forEach(function (column, i) {
        var cell = row.cells[column.index];
        var raw = cell.hasAttribute("data-value") ? cell.getAttribute("data-value") : cell.textContent;
        var number = raw === "" ? null : Number(raw);
        values[i].push(number === null || isNaN(number) ? null : number);
      });
    });
    return { labels: labels, series: columns.map(function (c) { return c.label; }), values: values };
  }

  function stack(values) {
    // Running sums: series i is drawn up to the sum of series 0..i (empty cells count as 0).
    var sums = [];
    values.forEach(function (series, i) {
      sums.push(series.map(function (v, j) { return (v || 0) + (i ? sums[i - 1][j] : 0); }));
    });
    return sums;
  }

  function yValues(unit) {
    // As many decimals as the axis step needs, so small dollar amounts do not all read "0".
    return function (u, splits, axis, space, increment) {
      var decimals = Math.max(0, Math.min(12, Math.ceil(-Math.log10(increment || 1))));
      return splits.map(function (v) {
        var text = v.toLocaleString(undefined, { minimumFractionDigits: decimals, maximumFractionDigits: decimals });
        return unit === "usd" ? "$" + text : unit === "percent" ? text + "%" : text;
      });
    };
  }

  function options(figure, data, kind) {
    var stacked = kind === "stacked-bars";
    var bars = stacked && uPlot.paths && uPlot.paths.bars ? uPlot.paths.bars({ size: [0.7, 60] }) : undefined;
    var series = [{ label: figure.getAttribute("data-x-label") || "" }];
    data.series.forEach(function (label, i) {
      var color = COLORS[i % COLORS.length];
      series.push({
        label: label,
        stroke: stacked ? SEPARATOR : color,
        fill: stacked ? color : undefined,
        width: stacked ? 1 : 2,
        paths: bars,
        points: { show: !stacked },
        spanGaps: false,
        // The legend shows each series' own value, not the running sum it is drawn at.
        value: function (u, v, si, idx) {
          var own = idx == null ? null : data.values[si - 1][idx];
          return own == null ? "–" : own.toLocaleString();
        },
      });
    });
    if (stacked) series = [series[0]].concat(series.slice(1).reverse());
    return {
      width: Math.max(320, figure.clientWidth || 800),
      height: Number(figure.getAttribute("data-height")) || 260,
      series: series,
      scales: {
        x: { time: false, range: function (u, min, max) { return [min - 0.5, max + 0.5]; } },
        y: { range: function (u, min, max) { return [Math.min(0, min), max > 0 ? max * 1.05 : 1]; } },
      },
      axes: [
        {
          // Hours are labelled by their time of day, days by month and day (the table has the full date).
          values: function (u, splits) {
            return splits.map(function (i) {
              var label = data.labels[i];
              if (label === undefined) return "";
              if (label.indexOf(" ") > 0) return label.split(" ")[1];
              return /^\d{4}-\d{2}-\d{2}$/.test(label) ? label.slice(5) : label;
            });
          },
        },
        { size: 80, values: yValues(figure.getAttribute("data-unit")) },
      ],
      legend: { show: true },
    };
  }

  function draw(figure) {
    if (figure.uplot || typeof uPlot === "undefined") return;
    var table = figure.querySelector("table.chart-data");
    var target = figure.querySelector(".chart-canvas");
    if (!table || !target || !table.tBodies.length) return;
    var kind = figure.getAttribute("data-chart");
    var data = readTable(table);
    var x = data.labels.map(function (_, i) { return i; });
    var ys = kind === "stacked-bars" ? stack(data.values).reverse() : data.values;
    figure.uplot = new uPlot(options(figure, data, kind), [x].concat(ys), target);
    figure.setAttribute("data-points", String(x.length));
  }

  function drawAll(root) {
    Array.prototype.forEach.call((root || document).querySelectorAll("figure[data-chart]"), draw);
  }

  document.addEventListener("DOMContentLoaded", function () { drawAll(document); });
  document.addEventListener("htmx:afterSwap", function (event) { drawAll(event.target); });
})();
