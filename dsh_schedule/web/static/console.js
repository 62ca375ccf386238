// The web console's own script (docs/web.md): the browser's time zone into the forms,
// the live parts of a page fed by server-sent events, and the countdowns. Every fragment
// it inserts was rendered, and escaped, by the server; it never builds markup from text.
(function () {
  "use strict";

  function browserZone() {
    try {
      return Intl.DateTimeFormat().resolvedOptions().timeZone || "";
    } catch (error) {
      return "";
    }
  }

  function fillZones(root) {
    var zone = browserZone();
    root.querySelectorAll("input[data-browser-zone]").forEach(function (input) {
      if (!input.value) {
        input.value = zone;
        input.setAttribute("value", zone);
      }
    });
    root.querySelectorAll("[data-show-browser-zone]").forEach(function (element) {
      element.textContent = zone || "unknown";
    });
  }

  function span(ms) {
    var seconds = Math.round(Math.abs(ms) / 1000);
    if (seconds < 90) return seconds + " s";
    var minutes = Math.round(seconds / 60);
    if (minutes < 90) return minutes + " min";
    return Math.round(minutes / 60) + " h";
  }

  // "YYYY-MM-DD HH:MM:SS ZONE" in the browser's zone: the form the server gives a
  // session's times in its zone, for times that belong to no session (the next wakes).
  function localTime(ms) {
    var zone = browserZone();
    try {
      var parts = {};
      new Intl.DateTimeFormat("en-GB", {
        timeZone: zone || undefined, hourCycle: "h23", year: "numeric", month: "2-digit",
        day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit"
      }).formatToParts(new Date(ms)).forEach(function (part) { parts[part.type] = part.value; });
      return parts.year + "-" + parts.month + "-" + parts.day + " " + parts.hour + ":" +
        parts.minute + ":" + parts.second + " " + (zone || "local");
    } catch (error) {
      return null;
    }
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-local-ms]").forEach(function (element) {
      var text = localTime(Number(element.getAttribute("data-local-ms")));
      if (text !== null && element.textContent !== text) element.textContent = text;
    });
    document.querySelectorAll("[data-due-ms]").forEach(function (element) {
      var left = Number(element.getAttribute("data-due-ms")) - now;
      element.textContent = left > 0 ? "in " + span(left) : "due " + span(left) + " ago";
      element.classList.toggle("overdue", left <= 0);
    });
    document.querySelectorAll("[data-at-ms]").forEach(function (element) {
      element.textContent = "(" + span(now - Number(element.getAttribute("data-at-ms"))) + " ago)";
    });
  }

  function stickToBottom(element) {
    if (element.hasAttribute("data-stick-bottom")) element.scrollTop = element.scrollHeight;
  }

  // Replace a live region with a fragment from the server, keeping open <details> open.
  function swap(element, html) {
    var open = Array.prototype.map.call(
      element.querySelectorAll("details[open][id]"), function (d) { return d.id; });
    var atBottom = element.scrollHeight - element.scrollTop - element.clientHeight < 60;
    element.innerHTML = html;
    open.forEach(function (id) {
      var details = document.getElementById(id);
      if (details) details.open = true;
    });
    if (window.htmx) window.htmx.process(element);
    if (atBottom) stickToBottom(element);
    tick();
  }

  function connect(root) {
    var source = new EventSource(root.getAttribute("data-stream"));
    var regions = Array.prototype.slice.call(root.querySelectorAll("[data-swap]"));
    if (root.hasAttribute("data-swap")) regions.push(root);
    regions.forEach(function (element) {
      source.addEventListener(element.getAttribute("data-swap"), function (event) {
        swap(element, event.data);
      });
    });
    source.addEventListener("open", function () { document.body.classList.add("live"); });
    source.addEventListener("error", function () { document.body.classList.remove("live"); });
    window.addEventListener("pagehide", function () { source.close(); });
  }

  function composer() {
    var form = document.getElementById("composer");
    if (!form) return;
    var problem = document.getElementById("composer-error");
    var input = form.querySelector("[name=text]");
    form.addEventListener("htmx:configRequest", function (event) {
      event.detail.parameters.clientTimeZone = browserZone();
    });
    form.addEventListener("htmx:afterRequest", function (event) {
      if (event.detail.successful) {
        input.value = "";
        problem.textContent = "";
        input.focus();
      }
    });
    form.addEventListener("htmx:responseError", function (event) {
      problem.textContent = event.detail.xhr.responseText || "the console refused the prompt";
    });
    form.addEventListener("htmx:sendError", function () {
      problem.textContent = "the console did not answer";
    });
    var transcript = document.getElementById("transcript");
    if (transcript) {
      transcript.addEventListener("htmx:afterSwap", function () { stickToBottom(transcript); tick(); });
      stickToBottom(transcript);
    }
  }

  // The create and edit forms, the delete, pause and resume buttons
  // (docs/web.md#acting-from-the-page): the
  // browser's zone goes with each post; the tool's answer, or the console's refusal, is
  // shown as text beside the form.
  function actions() {
    var result = document.getElementById("act-result");
    var problem = document.getElementById("act-error");
    if (!result || !problem) return;
    function acknowledged(event) {
      if (!event.detail.successful) return;
      var said = event.detail.xhr.getResponseHeader("X-Acknowledgement") || "";
      result.textContent = said ? decodeURIComponent(said) : "";
      problem.textContent = "";
    }
    function refused(event) {
      result.textContent = "";
      problem.textContent = event.detail.xhr.responseText || "the console refused the form";
    }
    // The answer is heard on the form itself: a live update may replace a row's form
    // while its post is on its way, and htmx then tells only the detached form.
    document.addEventListener("htmx:configRequest", function (event) {
      var form = event.target.closest &&
        event.target.closest("form.act, form.delete, form.update");
      if (!form) return;
      event.detail.parameters.clientTimeZone = browserZone();
      if (form.hasAttribute("data-acknowledged")) return;
      form.setAttribute("data-acknowledged", "");
      form.addEventListener("htmx:afterRequest", acknowledged);
      form.addEventListener("htmx:responseError", refused);
    });
    // Typing a selector's value picks that selector.
    document.querySelectorAll("form.act fieldset.selector label").forEach(function (label) {
      var radio = label.querySelector("input[type=radio]");
      label.querySelectorAll("input:not([type=radio])").forEach(function (input) {
        input.addEventListener("focus", function () { radio.checked = true; });
      });
    });
    // A row's Edit button fills the edit form with its id and prompt (as values, not markup).
    var edit = document.getElementById("edit-reminder");
    document.addEventListener("click", function (event) {
      var button = event.target.closest && event.target.closest("button[data-edit-id]");
      if (!button || !edit) return;
      edit.querySelector("[name=id]").value = button.getAttribute("data-edit-id");
      var prompt = edit.querySelector("[name=prompt]");
      prompt.value = button.getAttribute("data-edit-prompt") || "";
      prompt.focus();
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    fillZones(document);
    document.querySelectorAll("[data-stream]").forEach(connect);
    composer();
    actions();
    tick();
    document.addEventListener("htmx:afterSwap", function () { tick(); });
    window.setInterval(tick, 1000);
  });
})();
