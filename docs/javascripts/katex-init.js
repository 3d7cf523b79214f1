// Typeset the math that pymdownx.arithmatex (generic mode) leaves in <span class="arithmatex">
// and <div class="arithmatex">, with the KaTeX copy served from this site (no CDN).
(function () {
  function typeset() {
    var blocks = document.querySelectorAll(".arithmatex");
    for (var i = 0; i < blocks.length; i++) {
      renderMathInElement(blocks[i], {
        delimiters: [
          { left: "\\(", right: "\\)", display: false },
          { left: "\\[", right: "\\]", display: true }
        ],
        throwOnError: false
      });
    }
  }
  if (typeof document$ !== "undefined") {
    document$.subscribe(typeset); // mkdocs-material's page observable (instant navigation too)
  } else if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", typeset);
  } else {
    typeset();
  }
})();
