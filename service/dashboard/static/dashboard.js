// Copy buttons: <button data-copy="text">. Nothing else runs on the pages but htmx.
document.addEventListener("click", function (event) {
  var button = event.target.closest ? event.target.closest("button[data-copy]") : null;
  if (!button) return;
  var text = button.getAttribute("data-copy");
  var done = function () {
    button.textContent = "copied";
    setTimeout(function () { button.textContent = "copy"; }, 1200);
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, function () { button.textContent = "select"; });
  } else {
    var area = document.createElement("textarea");
    area.value = text;
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); done(); } catch (e) { button.textContent = "select"; }
    document.body.removeChild(area);
  }
});
