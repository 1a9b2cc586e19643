// Sortable, filterable tables of an attn-bench page (no library): a header click sorts its
// column (numbers as numbers, again to reverse); a <select data-filter="COL"> shows only the
// rows whose data-COL attribute equals its value ("" shows all).
(function () {
  function key(cell) {
    var text = cell.getAttribute("data-sort") || cell.textContent.trim();
    var number = parseFloat(text);
    return isNaN(number) || !/^[-+0-9.eE]+$/.test(text) ? text.toLowerCase() : number;
  }
  function sortBy(table, index, header) {
    var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
    var up = header.getAttribute("aria-sort") !== "ascending";
    rows.sort(function (a, b) {  // numbers before text (a missing value, "-"), either way
      var x = key(a.cells[index]), y = key(b.cells[index]);
      if (typeof x !== typeof y) { return typeof x === "number" ? -1 : 1; }
      return (x < y ? -1 : x > y ? 1 : 0) * (up ? 1 : -1);
    });
    rows.forEach(function (row) { body.appendChild(row); });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { h.removeAttribute("aria-sort"); });
    header.setAttribute("aria-sort", up ? "ascending" : "descending");
  }
  function filter(table) {
    var selects = document.querySelectorAll('select[data-table="' + table.id + '"]');
    Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
      var shown = Array.prototype.every.call(selects, function (s) {
        return !s.value || row.getAttribute("data-" + s.getAttribute("data-filter")) === s.value;
      });
      row.hidden = !shown;
    });
  }
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (header, index) {
      header.addEventListener("click", function () { sortBy(table, index, header); });
    });
  });
  Array.prototype.forEach.call(document.querySelectorAll("select[data-filter]"), function (select) {
    select.addEventListener("change", function () { filter(document.getElementById(select.getAttribute("data-table"))); });
  });
})();
