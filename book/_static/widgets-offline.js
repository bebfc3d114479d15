/* Two fixes for the saved ipywidgets views of the static book (served with the HTML manager
 * from _static/widgets/embed.js, see tools/web_assets.py):
 *
 * 1. The widgets typeset their labels with MathJax 2's API, MathJax.Hub.Queue(["Typeset",
 *    MathJax.Hub, element]); the book loads MathJax 3, which has no Hub, so every widget threw
 *    "Cannot read properties of undefined (reading 'Queue')" (found by tools/check_site.py).
 *    A small Hub that forwards to MathJax 3's typesetPromise is added once MathJax 3 has
 *    replaced window.MathJax (DOMContentLoaded; the widgets render later, on load).
 * 2. An Output widget draws its saved figure as an <img> without alt text; images inside a
 *    widget get one that says what they are.
 */
(function () {
  function addHub() {
    var mj = window.MathJax;
    if (mj && !mj.Hub) {
      mj.Hub = {
        Queue: function (job) {
          var element = Array.isArray(job) ? job[2] : undefined;
          if (mj.typesetPromise) {
            mj.typesetPromise(element ? [element] : undefined).catch(function () {});
          }
        },
      };
    }
  }

  var ALT = "Saved view of the interactive explorer, as the page's build left it " +
            "(in a live notebook its controls redraw this picture)";

  function labelImages(root) {
    var imgs = root.querySelectorAll(".jupyter-widgets img, .widget-output img");
    imgs.forEach(function (img) {
      if (!img.getAttribute("alt")) img.setAttribute("alt", ALT);
    });
  }

  addHub();
  document.addEventListener("DOMContentLoaded", function () {
    addHub();
    // only the nodes each mutation adds are scanned (MathJax also mutates the page, a lot)
    new MutationObserver(function (records) {
      records.forEach(function (r) {
        r.addedNodes.forEach(function (node) {
          if (node.nodeType !== 1) return;
          if (node.tagName === "IMG" && node.closest(".jupyter-widgets, .widget-output")) {
            if (!node.getAttribute("alt")) node.setAttribute("alt", ALT);
          } else {
            labelImages(node);
          }
        });
      });
    }).observe(document.body, { childList: true, subtree: true });
  });
})();
