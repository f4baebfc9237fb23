
(function () {
  "use strict";
  var cache = {};
  function data(id) {
    if (!cache[id]) cache[id] = JSON.parse(document.getElementById("data-" + id).textContent);
    return cache[id];
  }
  function fmt(v) {
    if (v === null) return "";
    if (Math.abs(v) >= 999.95) return Math.round(v).toLocaleString("en-US");
    if (v === 0) return "0";
    if (Math.floor(Math.log10(Math.abs(v))) < -4) {
      return v.toExponential(3).replace(/\.?0+e/, "e").replace(/e([+-])(\d)$/, "e$10$2");
    }
    return String(parseFloat(v.toPrecision(4)));
  }
  function cell(col, i) {
    if (typeof col === "string") return col;
    if (typeof col === "number" || col === null) return fmt(col);
    if (Array.isArray(col)) return col[i];
    if (col.n) return fmt(col.n[i]);
    return col.l[Math.floor(i / col.r) % col.l.length];
  }
  function esc(text) {
    return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  function show(box, page) {
    var d = data(box.getAttribute("data-table"));
    var select = box.querySelector("select");
    var size = select ? parseInt(select.value, 10) : d.n;
    var pages = Math.max(1, Math.ceil(d.n / size));
    page = Math.min(Math.max(page, 0), pages - 1);
    var start = page * size, end = Math.min(d.n, start + size), html = [];
    for (var i = start; i < end; i++) {
      var row = "<tr>";
      for (var c = 0; c < d.c.length; c++) {
        row += "<td class='" + d.k[c] + "'>" + esc(cell(d.c[c], i)) + "</td>";
      }
      html.push(row + "</tr>");
    }
    box.querySelector("tbody").innerHTML = html.join("");
    box.setAttribute("data-page", page);
    box.querySelector(".pos").textContent = "rows " + (start + 1).toLocaleString("en-US") +
      "\u2013" + end.toLocaleString("en-US") + " of " + d.n.toLocaleString("en-US");
  }
  function draw(figure) {
    var template = figure.querySelector("template");
    if (template) figure.replaceChild(template.content.cloneNode(true), template);
    figure.classList.remove("lazy");
  }
  var figures = document.querySelectorAll("figure.lazy");
  if ("IntersectionObserver" in window) {
    var observer = new IntersectionObserver(function (entries) {
      entries.forEach(function (entry) {
        if (entry.isIntersecting) { observer.unobserve(entry.target); draw(entry.target); }
      });
    }, {rootMargin: "1200px 0px"});
    figures.forEach(function (figure) { observer.observe(figure); });
  } else {
    figures.forEach(draw);
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest("button[data-go]");
    if (!button) return;
    var box = button.closest(".pager"), page = parseInt(box.getAttribute("data-page"), 10);
    var go = button.getAttribute("data-go");
    show(box, go === "first" ? 0 : go === "last" ? 1e12 : go === "next" ? page + 1 : page - 1);
  });
  document.addEventListener("change", function (event) {
    var box = event.target.closest(".pager");
    if (box) show(box, 0);
  });
})();
