(function () {
  "use strict";
  // Filters the report's table index by name: every space-separated term must occur
  // (case-insensitive). O(tables) per keystroke; no network, no library. While a filter is set
  // the index lays out every block (content-visibility off), so hidden rows leave no gaps.
  var box = document.getElementById("table-search");
  var count = document.getElementById("table-count");
  var index = document.getElementById("table-index");
  if (!box || !index) return;
  var blocks = null, total = 0;
  function read() {
    blocks = [];
    index.querySelectorAll(".ic").forEach(function (block) {
      var rows = [];
      block.querySelectorAll(".ir").forEach(function (row) {
        rows.push([row, (row.getAttribute("data-name") || "").toLowerCase()]);
      });
      total += rows.length;
      blocks.push([block, rows]);
    });
  }
  function filter() {
    if (!blocks) read();
    var terms = box.value.toLowerCase().split(/\s+/).filter(Boolean), shown = 0;
    index.classList.toggle("filtering", terms.length > 0);
    blocks.forEach(function (pair) {
      var hits = 0;
      pair[1].forEach(function (row) {
        var hit = terms.every(function (term) { return row[1].indexOf(term) !== -1; });
        row[0].hidden = !hit;
        if (hit) hits++;
      });
      pair[0].hidden = hits === 0;
      shown += hits;
    });
    count.textContent = terms.length ? shown.toLocaleString("en-US") + " of " +
      total.toLocaleString("en-US") + " tables" : total.toLocaleString("en-US") + " tables";
  }
  box.addEventListener("input", filter);
  if (box.value) filter();  // a value the browser restored on reload
})();
