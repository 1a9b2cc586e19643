// Draws an attn-bench page's figures: Plotly's own bundle is inline, gzip-compressed and
// base64-encoded (script#plotly-gz), unpacked with the browser's DecompressionStream (no
// request) and run as a script of a blob URL (allowed by the page's Content-Security-Policy
// through 'strict-dynamic'; no eval), then every div.plot is drawn from the figure JSON beside
// it. When all are drawn, <body data-plots-drawn="N"> says how many (data-plots-ms: when,
// after navigation start); a failure is written to data-plots-error. A click on a point of a
// figure with data-links opens its link only when it is a relative path (no scheme).
window.plotlyReady = (async function () {
  var text = atob(document.getElementById("plotly-gz").textContent.trim());
  var bytes = new Uint8Array(text.length);
  for (var i = 0; i < text.length; i++) { bytes[i] = text.charCodeAt(i); }
  var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  var url = URL.createObjectURL(new Blob([await new Response(stream).text()], {type: "text/javascript"}));
  await new Promise(function (resolve, reject) {
    var script = document.createElement("script");
    script.onload = resolve;
    script.onerror = function () { reject(new Error("Plotly's bundle did not run")); };
    script.src = url;
    document.head.appendChild(script);
  });
  URL.revokeObjectURL(url);
  return window.Plotly;
})();
window.plotlyReady.then(function (Plotly) {
  var plots = Array.prototype.slice.call(document.querySelectorAll("div.plot"));
  return Promise.all(plots.map(function (div) {
    var fig = JSON.parse(document.getElementById(div.id + "-data").textContent);
    return Plotly.newPlot(div, fig.data, fig.layout, {displaylogo: false, responsive: true}).then(function () {
      if (div.getAttribute("data-links")) {
        div.on("plotly_click", function (event) {
          var data = event.points[0].customdata, link = data && data[data.length - 1];
          if (link && !/^([a-z][a-z0-9+.-]*:|[\/\\])/i.test(link)) { window.location.href = link; }
        });
      }
    });
  })).then(function () {
    document.body.setAttribute("data-plots-ms", String(Math.round(performance.now())));
    document.body.setAttribute("data-plots-drawn", String(plots.length));
  });
}).catch(function (error) { document.body.setAttribute("data-plots-error", String(error)); throw error; });
